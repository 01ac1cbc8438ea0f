/* ops_cuda_load: ops_cuda.h's functions on the CPU side of a CUDA build. The backend itself is
 * build/libustrain_cuda.so (cuda_plugin.h); the first ops_cuda_create opens the CUDA runtime,
 * cuBLASLt and cuBLAS (core/base/dynlib.h: UST_CUDA_LIB_DIR, the standard search, the toolkit;
 * the driver check), then the plugin, whose own dependencies then resolve to those. The plugin
 * is looked for at $UST_CUDA_PLUGIN, where the build wrote it, beside the binary, in build/
 * beside it and one folder up (build/test/ -> build/: a copied tree or bundle). The emulator
 * build links the backend in directly and only ops_cuda_versions is here. */
#ifdef UST_CUDA

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops_cuda.h"

#ifdef UST_CUDA_EMU

void ops_cuda_versions(int *driver, int *runtime) { *driver = *runtime = 0; }

#else

#include <dlfcn.h>
#include <pthread.h>

#include "cuda_plugin.h"
#include "dynlib.h"

#ifndef UST_CUDA_PLUGIN_PATH
#define UST_CUDA_PLUGIN_PATH "build/libustrain_cuda.so"
#endif

/* The loaded plugin, or why it failed: set once per process (pthread_once) and read-only after;
 * process-wide like the dlopen behind it. */
static const ust_cuda_plugin *g_plugin;
static char g_why[1536];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int try_plugin(const char *path, ust_err *e) {
    if (access(path, F_OK) != 0) return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *err = dlerror();
        ust_errf(e, "CUDA backend plugin %s could not be loaded: %s", path, err ? err : "?");
        return -1;
    }
    const ust_cuda_plugin *p = dlsym(h, UST_CUDA_PLUGIN_SYMBOL);
    if (!p || p->abi != UST_CUDA_PLUGIN_ABI || p->ops_size != sizeof(ust_ops)) {
        ust_errf(e, "%s is not this build's CUDA backend plugin (%s); rebuild with make", path,
                 p ? "other ABI" : "no " UST_CUDA_PLUGIN_SYMBOL);
        dlclose(h);
        return -1;
    }
    g_plugin = p;
    return 1;
}

/* The plugin's candidate paths, in the order of the header. */
static int find_plugin(ust_err *e) {
    const char *env = getenv("UST_CUDA_PLUGIN");
    if (env && *env) {
        int r = try_plugin(env, e);
        if (!r) ust_errf(e, "UST_CUDA_PLUGIN=%s: no such file", env);
        return r > 0 ? 0 : -1;
    }
    char exe[PATH_MAX], cand[4][PATH_MAX + 48];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(cand[0], sizeof cand[0], "%s", UST_CUDA_PLUGIN_PATH);
    snprintf(cand[1], sizeof cand[1], "%s/libustrain_cuda.so", exe);
    snprintf(cand[2], sizeof cand[2], "%s/build/libustrain_cuda.so", exe);
    snprintf(cand[3], sizeof cand[3], "%s/../libustrain_cuda.so", exe);
    for (int i = 0; i < 4; i++) {
        int r = try_plugin(cand[i], e);
        if (r) return r > 0 ? 0 : -1;
    }
    return ust_errf(e,
                    "the CUDA backend plugin libustrain_cuda.so was not found (searched %s, %s, "
                    "%s, %s; set UST_CUDA_PLUGIN to its path)",
                    cand[0], cand[1], cand[2], cand[3]);
}

static void load_once(void) {
    ust_err e = {{0}};
    char note[512], so[64];
    void *rt = dynlib_cudart(&e, note, sizeof note);
    if (note[0]) fprintf(stderr, "ustrain: CUDA: %s\n", note);
    int ok = rt && dynlib_open(dynlib_cuda_soname("libcublasLt", so, sizeof so), &e) &&
             dynlib_open(dynlib_cuda_soname("libcublas", so, sizeof so), &e) &&
             find_plugin(&e) == 0;
    if (!ok) snprintf(g_why, sizeof g_why, "%s", e.msg);
}

/* The plugin, or NULL with "run.device = cuda: <why>" in e. */
static const ust_cuda_plugin *plugin(ust_err *e) {
    pthread_once(&g_once, load_once);
    if (!g_plugin) ust_errf(e, "run.device = cuda: %s", g_why);
    return g_plugin;
}

ust_ops *ops_cuda_create(int device, ust_err *e) {
    const ust_cuda_plugin *p = plugin(e);
    if (!p) return NULL;
    ust_ops *o = p->create(device, e);
    if (!o && e) {
        int d, r;
        p->versions(&d, &r);
        size_t len = strlen(e->msg);
        snprintf(e->msg + len, sizeof e->msg - len, " [CUDA driver %d.%d, runtime %d.%d]", d / 1000,
                 d % 1000 / 10, r / 1000, r % 1000 / 10);
    }
    return o;
}

void ops_cuda_set_bf16(ust_ops *o, int on) {
    ust_err e;
    const ust_cuda_plugin *p = plugin(&e);
    if (p) p->set_bf16(o, on); /* o came from create, so the plugin is loaded */
}

void ops_cuda_versions(int *driver, int *runtime) {
    ust_err e;
    const ust_cuda_plugin *p = plugin(&e);
    *driver = *runtime = 0;
    if (p) p->versions(driver, runtime);
}

#endif
#endif
