/* bootstrap over PMIx: srun --mpi=pmix, and OpenMPI's mpirun, which is a PMIx server for any
 * program, MPI or not. PMIx keys are already scoped by process, so boot_put(key) is a PMIx_Put of
 * "ust.<key>" and boot_get(rank, key) a PMIx_Get on (namespace, rank). The job id is the PMIx
 * namespace, which is the same on every rank and different for every job step. */
#include <math.h>
#include <pmix.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap_impl.h"
#include "log.h"

extern char **environ;

struct boot_pmix {
    pmix_proc_t me;
    uint32_t fence_gen;
};

int boot_pmix_available(void) {
    if (getenv("PMIX_RANK") || getenv("PMIX_NAMESPACE")) return 1;
    for (char **v = environ; *v; v++)
        if (!strncmp(*v, "PMIX_SERVER_URI", 15)) return 1;
    return 0;
}

/* An integer attribute of proc, looked up only in what the server gave us at init (no waiting).
 * Returns 1 when found. */
static int pmix_int(const pmix_proc_t *proc, const char *key, long *out) {
    pmix_info_t info;
    bool yes = true;
    PMIX_INFO_CONSTRUCT(&info);
    PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, &yes, PMIX_BOOL);
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(proc, key, &info, 1, &v);
    PMIX_INFO_DESTRUCT(&info);
    if (rc != PMIX_SUCCESS || !v) return 0;
    int ok = 1;
    switch (v->type) {
    case PMIX_UINT8:
        *out = v->data.uint8;
        break;
    case PMIX_UINT16:
        *out = v->data.uint16;
        break;
    case PMIX_UINT32:
        *out = (long)v->data.uint32;
        break;
    case PMIX_UINT64:
        *out = (long)v->data.uint64;
        break;
    case PMIX_INT:
        *out = v->data.integer;
        break;
    case PMIX_INT32:
        *out = v->data.int32;
        break;
    case PMIX_SIZE:
        *out = (long)v->data.size;
        break;
    case PMIX_PROC_RANK:
        *out = (long)v->data.rank;
        break;
    default:
        ok = 0;
    }
    PMIX_VALUE_RELEASE(v);
    return ok;
}

int boot_pmix_init(ust_boot *b, ust_err *e) {
    struct boot_pmix *p = calloc(1, sizeof *p);
    if (!p) return ust_errf(e, "out of memory");
    /* PMIx starts a progress thread: it inherits a mask that blocks every signal, so SIGTERM and
     * SIGUSR1 (graceful stop) are handled by our own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pmix_status_t rc = PMIx_Init(&p->me, NULL, 0);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != PMIX_SUCCESS) {
        /* PMIX_* variables without a server (e.g. inherited from an outer job): not ours. */
        ust_errf(e, "PMIx_Init: %s", PMIx_Error_string(rc));
        free(p);
        return 1;
    }
    b->impl->pmix = p;
    b->kind = BOOT_PMIX;
    pmix_proc_t wild;
    PMIX_LOAD_PROCID(&wild, p->me.nspace, PMIX_RANK_WILDCARD);
    long world = 0, lr = 0, lw = 0, node = 0, nnodes = 0;
    if (!pmix_int(&wild, PMIX_JOB_SIZE, &world) || world < 1)
        return ust_errf(e, "PMIx server (namespace %s) did not give the job size", p->me.nspace);
    b->rank = (int)p->me.rank, b->world = (int)world;
    if (b->rank < 0 || b->rank >= b->world)
        return ust_errf(e, "PMIx rank %d outside the job size %d", b->rank, b->world);
    if (b->world > 1) ust_error_set_rank(b->rank);

    /* The namespace is unique among running jobs but repeats across restarts of a launcher (a
     * fresh Slurm numbers jobs from 1 again), so rank 0 adds a random part that everyone reads
     * after the first fence; it also makes boot_init wait until every rank is there. */
    char ns[PMIX_MAX_NSLEN + 1], rnd[32];
    size_t i = 0;
    for (; p->me.nspace[i] && i < PMIX_MAX_NSLEN; i++) {
        char c = p->me.nspace[i];
        ns[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                        c == '-' || c == '_' || c == '.'
                    ? c
                    : '_';
    }
    ns[i] = 0;
    if (b->rank == 0) {
        boot_random_id(rnd, sizeof rnd, "r");
        if (boot_pmix_put(b, "jobid", rnd, strlen(rnd), e) < 0) return -1;
    }
    if (boot_pmix_fence(b, e) < 0) return -1;
    int n = boot_pmix_get(b, 0, "jobid", rnd, sizeof rnd - 1, e);
    if (n < 0) return -1;
    rnd[n] = 0;
    snprintf(b->job_id, sizeof b->job_id, "pmix-%.36s-%.16s", ns, rnd + 2);

    int have_local =
        pmix_int(&p->me, PMIX_LOCAL_RANK, &lr) && pmix_int(&wild, PMIX_LOCAL_SIZE, &lw);
    if (have_local && lw >= 1 && lr < lw) {
        b->local_rank = (int)lr, b->local_world = (int)lw;
    } else {
        b->local_rank = b->rank, b->local_world = b->world; /* assume one node */
    }
    if (pmix_int(&p->me, PMIX_NODEID, &node) && pmix_int(&wild, PMIX_NUM_NODES, &nnodes) &&
        nnodes >= 1 && node < nnodes) {
        b->node_id = (int)node, b->nnodes = (int)nnodes;
    } else {
        b->nnodes = (b->world + b->local_world - 1) / b->local_world;
        b->node_id = b->rank / b->local_world;
    }
    return 0;
}

static void pmix_key(char *out, size_t cap, const char *key) { snprintf(out, cap, "ust.%s", key); }

int boot_pmix_put(ust_boot *b, const char *key, const void *val, size_t len, ust_err *e) {
    char k[PMIX_MAX_KEYLEN + 1];
    pmix_key(k, sizeof k, key);
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = (char *)val; /* PMIx_Put copies; we must not destruct our buffer */
    v.data.bo.size = len;
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, k, &v);
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS)
        return ust_errf(e, "PMIx put of key '%s' failed: %s", key, PMIx_Error_string(rc));
    (void)b;
    return 0;
}

int boot_pmix_fence(ust_boot *b, ust_err *e) {
    struct boot_pmix *p = b->impl->pmix;
    uint32_t gen = p->fence_gen++;
    pmix_info_t info[2];
    bool collect = true;
    int tmo = (int)ceil(b->timeout_s);
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &tmo, PMIX_INT);
    double t0 = log_now_s();
    pmix_status_t rc = PMIx_Fence(NULL, 0, info, 2);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc != PMIX_SUCCESS)
        return ust_errf(e,
                        "bootstrap fence %u (PMIx, namespace %s, %d ranks) failed after %.1f s: "
                        "%s; PMIx does not say which ranks did not arrive",
                        gen, p->me.nspace, b->world, log_now_s() - t0, PMIx_Error_string(rc));
    return 0;
}

/* One PMIx_Get of (who, k), waiting up to tmo seconds; refresh: fetch the owner's data again
 * rather than answer from what this process has cached of it. */
static pmix_status_t pmix_get_once(const pmix_proc_t *who, const char *k, int tmo, bool refresh,
                                   pmix_value_t **v) {
    pmix_info_t info[2];
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_LOAD(&info[0], PMIX_TIMEOUT, &tmo, PMIX_INT);
    PMIX_INFO_LOAD(&info[1], PMIX_GET_REFRESH_CACHE, &refresh, PMIX_BOOL);
    *v = NULL;
    pmix_status_t rc = PMIx_Get(who, k, info, 2, v);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    return rc;
}

int boot_pmix_get(ust_boot *b, int rank, const char *key, void *val, size_t cap, ust_err *e) {
    struct boot_pmix *p = b->impl->pmix;
    char k[PMIX_MAX_KEYLEN + 1];
    pmix_key(k, sizeof k, key);
    pmix_proc_t who;
    PMIX_LOAD_PROCID(&who, p->me.nspace, (pmix_rank_t)rank);
    int tmo = (int)ceil(b->timeout_s);
    pmix_value_t *v = NULL;
    pmix_status_t rc = pmix_get_once(&who, k, tmo, false, &v);
    /* PMIx waits for a key only until its owner has committed anything: a key the owner puts
     * after an earlier commit (gloo's rendezvous, one key per peer) is NOT-FOUND until it
     * lands. The contract (bootstrap.h) is to wait for it: poll, asking the owner again each
     * time, sleeping 1 ms growing to 50 ms, until the bootstrap timeout. */
    double t0 = log_now_s();
    for (long nap = 1000000; rc == PMIX_ERR_NOT_FOUND && log_now_s() - t0 < b->timeout_s;) {
        if (v) PMIX_VALUE_RELEASE(v);
        struct timespec ts = {0, nap};
        nanosleep(&ts, NULL);
        nap = nap < 50000000 ? nap * 2 : nap;
        rc = pmix_get_once(&who, k, tmo, true, &v);
    }
    if (rc != PMIX_SUCCESS || !v) {
        if (v) PMIX_VALUE_RELEASE(v);
        return ust_errf(e, "bootstrap get of key '%s' from rank %d (PMIx) failed%s: %s", key, rank,
                        rc == PMIX_ERR_TIMEOUT || rc == PMIX_ERR_NOT_FOUND ? " after the timeout" : "",
                        PMIx_Error_string(rc));
    }
    int r;
    if (v->type != PMIX_BYTE_OBJECT)
        r = ust_errf(e, "bootstrap get of key '%s' from rank %d: PMIx value of type %d, not bytes",
                     key, rank, (int)v->type);
    else if (v->data.bo.size > cap)
        r = ust_errf(e,
                     "bootstrap get of key '%s' from rank %d: value of %zu bytes does not fit a "
                     "buffer of %zu",
                     key, rank, v->data.bo.size, cap);
    else {
        if (v->data.bo.size) memcpy(val, v->data.bo.bytes, v->data.bo.size);
        r = (int)v->data.bo.size;
    }
    PMIX_VALUE_RELEASE(v);
    return r;
}

void boot_pmix_finalize(ust_boot *b) {
    struct boot_pmix *p = b->impl->pmix;
    if (!p) return;
    PMIx_Finalize(NULL, 0);
    free(p);
    b->impl->pmix = NULL;
}
