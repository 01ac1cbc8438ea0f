/* nccl_api: the table of nccl_api.h, resolved once (see there). */
#ifdef UST_NCCL

#define NCCL_API_IMPL
#include "nccl_api.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dynlib.h"

/* Filled once under pthread_once, read-only afterwards (process-wide, as dlopen is). */
static nccl_api_table g_api;
static int g_loaded;
static char g_why[sizeof(((ust_err *)0)->msg)];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef UST_CUDA_EMU
/* The emulator (cuda/emu) defines every name itself: no library to open. */
static void load_once(void) {
#define NCCL_API_SET(name) g_api.name = name;
    NCCL_API_CUDART(NCCL_API_SET)
    NCCL_API_NCCL(NCCL_API_SET)
#undef NCCL_API_SET
    g_loaded = 1;
}
#else
/* *slot (a function pointer) = symbol name of lib; memcpy, as dlsym hands a void * */
static int sym(void *lib, const char *soname, const char *name, void *slot, ust_err *e) {
    void *p = dynlib_sym(lib, soname, name, e);
    if (p) memcpy(slot, &p, sizeof p);
    return p != NULL;
}

static void load_once(void) {
    ust_err e = {{0}};
    char note[512];
    void *rt = dynlib_cudart(&e, note, sizeof note);
    void *nc = rt ? dynlib_open("libnccl.so.2", &e) : NULL;
    char so[64];
    dynlib_cuda_soname("libcudart", so, sizeof so);
    int ok = rt && nc;
#define NCCL_API_RT(name) ok = ok && sym(rt, so, #name, &g_api.name, &e);
#define NCCL_API_NC(name) ok = ok && sym(nc, "libnccl.so.2", #name, &g_api.name, &e);
    NCCL_API_CUDART(NCCL_API_RT)
    NCCL_API_NCCL(NCCL_API_NC)
#undef NCCL_API_NC
#undef NCCL_API_RT
    if (ok && note[0]) fprintf(stderr, "ustrain: CUDA: %s\n", note);
    if (!ok) snprintf(g_why, sizeof g_why, "%s%s%s", e.msg, note[0] ? "; " : "", note);
    g_loaded = ok;
}
#endif

int nccl_api_load(ust_err *e) {
    pthread_once(&g_once, load_once);
    return g_loaded ? 0 : ust_errf(e, "comm/nccl: %s", g_why);
}

const nccl_api_table *nccl_api(void) {
    UST_ASSERT(g_loaded, "the NCCL/CUDA runtime table is used before nccl_api_load succeeded");
    return &g_api;
}

#endif
