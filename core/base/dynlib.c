#include "dynlib.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The toolkit the build compiled against (Makefile: CUDA_HOME, the major of nvcc's release); a
 * build without nvcc keeps these defaults, used only in messages and the last search place. */
#ifndef UST_CUDA_HOME
#define UST_CUDA_HOME "/usr/local/cuda"
#endif
#ifndef UST_CUDA_MAJOR
#define UST_CUDA_MAJOR 13
#endif

const char *dynlib_cuda_soname(const char *stem, char *buf, size_t size) {
    snprintf(buf, size, "%s.so.%d", stem, UST_CUDA_MAJOR);
    return buf;
}

/* Appends "; " and the loader's reason for path to why (bounded). */
static void add_reason(char *why, size_t n, const char *path) {
    const char *err = dlerror();
    size_t len = strlen(why);
    if (len + 4 < n)
        snprintf(why + len, n - len, "%s%s: %s", len ? "; " : "", path, err ? err : "?");
}

static void *try_dir(const char *dir, size_t dlen, const char *soname, char *why, size_t n) {
    char path[PATH_MAX];
    if (dlen == 0 || dlen + strlen(soname) + 2 > sizeof path) return NULL;
    snprintf(path, sizeof path, "%.*s/%s", (int)dlen, dir, soname);
    if (access(path, F_OK) != 0) return NULL; /* absent: said once, in the search list */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) add_reason(why, n, path);
    return h;
}

void *dynlib_open(const char *soname, ust_err *e) {
    char why[768] = "";
    const char *dirs = getenv("UST_CUDA_LIB_DIR");
    for (const char *d = dirs; d && *d;) {
        size_t len = strcspn(d, ":");
        void *h = try_dir(d, len, soname, why, sizeof why);
        if (h) return h;
        d += len + (d[len] == ':');
    }
    /* the standard search: LD_LIBRARY_PATH, the binary's RUNPATH, ld.so.cache, /lib, /usr/lib */
    void *h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
    const char *err = dlerror();
    if (err && !strstr(err, "cannot open shared object file")) /* found, but failed to load */
        snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", err);
    h = try_dir(UST_CUDA_HOME "/lib64", strlen(UST_CUDA_HOME "/lib64"), soname, why, sizeof why);
    if (h) return h;
    const char *ld = getenv("LD_LIBRARY_PATH");
    ust_errf(e,
             "%s could not be loaded (searched: UST_CUDA_LIB_DIR=%s, the standard search with "
             "LD_LIBRARY_PATH=%s, then %s/lib64)%s%s; install it or set UST_CUDA_LIB_DIR to the "
             "folder that holds it",
             soname, dirs ? dirs : "(unset)", ld ? ld : "(unset)", UST_CUDA_HOME,
             why[0] ? ": " : "", why);
    return NULL;
}

void *dynlib_sym(void *h, const char *soname, const char *name, ust_err *e) {
    void *p = dlsym(h, name);
    if (!p)
        ust_errf(e, "%s has no symbol %s (an older release than this build needs?)", soname, name);
    return p;
}

/* cuDriverGetVersion of the libcuda.so.1 opened as h: CUDA major*1000 + minor*10, 0 if unknown */
static int driver_version(void *h) {
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int v = 0;
    if (!get || get(&v) != 0) return 0;
    return v;
}

static char g_driver_note[512]; /* what the one driver check found, kept for every caller */

/* The driver check of the header, once per process. The CUDA runtime dlopens libcuda.so.1 by
 * soname when first called, and the loader then returns an object already loaded under that
 * soname: loading compat/libcuda.so.1 by path first is what makes the runtime use it. That needs
 * the system one unloaded again after reading its version (dlclose; verified with RTLD_NOLOAD). */
static void driver_check(void) {
    char *note = g_driver_note;
    size_t n = sizeof g_driver_note;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return; /* no driver: the runtime says so itself (cudaErrorInsufficientDriver) */
    int have = driver_version(h), need = UST_CUDA_MAJOR * 1000;
    const char *off = getenv("UST_CUDA_COMPAT");
    if (have >= need || (off && !strcmp(off, "0"))) return;
    char dir[PATH_MAX], lib[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s", off && off[0] ? off : UST_CUDA_HOME "/compat");
    snprintf(lib, sizeof lib, "%s/libcuda.so.1", dir);
    int w =
        snprintf(note, n, "the driver supports CUDA %d.%d, older than this build's runtime %d.0",
                 have / 1000, have % 1000 / 10, UST_CUDA_MAJOR);
    if (w < 0 || (size_t)w >= n) return;
    note += w, n -= (size_t)w;
    if (access(lib, R_OK) != 0) {
        snprintf(note, n, ", and %s is absent (install the toolkit's cuda-compat package)", lib);
        return;
    }
    dlclose(h);
    void *still = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (still) {
        dlclose(still);
        snprintf(note, n, "; the system driver library stays loaded: rerun with LD_LIBRARY_PATH=%s",
                 dir);
        return;
    }
    void *c = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!c) {
        const char *err = dlerror();
        snprintf(note, n, "; %s failed to load: %s", lib, err ? err : "?");
        dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL); /* back to the system one */
        return;
    }
    int v = driver_version(c);
    snprintf(note, n, ": using %s (CUDA %d.%d)", lib, v / 1000, v % 1000 / 10);
}

static pthread_once_t g_driver_once = PTHREAD_ONCE_INIT;

void *dynlib_cudart(ust_err *e, char *note, size_t note_size) {
    pthread_once(&g_driver_once, driver_check);
    if (note && note_size) snprintf(note, note_size, "%s", g_driver_note);
    char so[64];
    return dynlib_open(dynlib_cuda_soname("libcudart", so, sizeof so), e);
}
