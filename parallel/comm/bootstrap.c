/* bootstrap: launcher detection and the single-process and torchrun-style paths.
 * PMIx lives in bootstrap_pmix.c, the TCP key-value store in bootstrap_store.c.
 *
 * Detection looks only at the environment first, so a plain `./ustrain` starts at once:
 *   PMIX_RANK / PMIX_NAMESPACE / PMIX_SERVER_URI*  -> PMIx (srun --mpi=pmix, mpirun)
 *   RANK or WORLD_SIZE                             -> torchrun-style environment + TCP store
 *   otherwise                                      -> single process, unless a launcher variable
 *                                                     (SLURM_NTASKS, OMPI_COMM_WORLD_SIZE,
 *                                                     PMI_SIZE) says there are several tasks.
 *
 * On the environment path every rank presents UST_JOB_SECRET to rank 0's store (scripts/ustrun
 * makes one per job). Without it the store accepts any client, and rank 0 says so once on
 * stderr: a plain torchrun-style environment keeps working, unprotected. UST_JOB_ID, when set
 * (ustrun sets it), becomes the job id, so the launcher can find what the job left in /dev/shm. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_impl.h"
#include "log.h"

const char *boot_kind_name(boot_kind k) {
    switch (k) {
    case BOOT_SINGLE:
        return "single";
    case BOOT_ENV:
        return "env";
    case BOOT_PMIX:
        return "pmix";
    }
    return "?";
}

int boot_env_int(const char *name, long lo, long hi, long *v, ust_err *e) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    while (*end == ' ' || *end == '\n') end++;
    if (errno || end == s || *end || x < lo || x > hi) {
        if (hi == INT_MAX)
            return ust_errf(e, "environment variable %s='%s' is not an integer >= %ld", name, s,
                            lo);
        return ust_errf(e, "environment variable %s='%s' is not an integer in [%ld, %ld]", name, s,
                        lo, hi);
    }
    *v = x;
    return 1;
}

static int key_ok(const char *key, ust_err *e) {
    if (!key || !store_key_valid(key) || strlen(key) > BOOT_MAX_KEY)
        return ust_errf(e,
                        "bootstrap key '%s' is empty, longer than %d or has spaces or "
                        "non-ASCII bytes",
                        key ? key : "(null)", BOOT_MAX_KEY);
    return 0;
}

/* ---------------------------------------------------------------- local key-value */

static int local_put(boot_impl *im, const char *key, const void *val, size_t len, ust_err *e) {
    local_kv *x = im->kv;
    while (x && strcmp(x->key, key)) x = x->next;
    void *nv = malloc(len ? len : 1);
    if (!nv) return ust_errf(e, "out of memory");
    memcpy(nv, val, len);
    if (!x) {
        x = calloc(1, sizeof *x);
        char *k = strdup(key);
        if (!x || !k) return free(x), free(k), free(nv), ust_errf(e, "out of memory");
        x->key = k;
        x->next = im->kv;
        im->kv = x;
    } else {
        free(x->val);
    }
    x->val = nv, x->len = len;
    return 0;
}

static int local_get(boot_impl *im, const char *key, void *val, size_t cap, ust_err *e) {
    for (local_kv *x = im->kv; x; x = x->next)
        if (!strcmp(x->key, key)) {
            if (x->len > cap)
                return ust_errf(e,
                                "bootstrap get of key '%s': value of %zu bytes does not fit a "
                                "buffer of %zu",
                                key, x->len, cap);
            memcpy(val, x->val, x->len);
            return (int)x->len;
        }
    /* Nobody else could ever put it: waiting would only delay the same answer. */
    return ust_errf(e, "bootstrap get of key '%s' from rank 0: never put (single process)", key);
}

/* ---------------------------------------------------------------- torchrun-style environment */

/* Local rank/size and node from the hostnames every rank publishes (LOCAL_RANK unset). Node ids
 * follow the order of each host's lowest rank. */
static int derive_local_from_hosts(ust_boot *b, ust_err *e) {
    enum { HL = 256 };
    char *hosts = calloc((size_t)b->world, HL);
    if (!hosts) return ust_errf(e, "out of memory");
    for (int r = 0; r < b->world; r++) {
        int n = boot_get(b, r, "ust.host", hosts + (size_t)r * HL, HL - 1, e);
        if (n < 0) return free(hosts), -1;
    }
    const char *mine = hosts + (size_t)b->rank * HL;
    b->local_rank = 0, b->local_world = 0, b->node_id = 0, b->nnodes = 0;
    for (int r = 0; r < b->world; r++) {
        const char *h = hosts + (size_t)r * HL;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++) seen = !strcmp(hosts + (size_t)q * HL, h);
        if (!seen) {
            if (!strcmp(h, mine)) b->node_id = b->nnodes;
            b->nnodes++;
        }
        if (!strcmp(h, mine)) {
            if (r < b->rank) b->local_rank++;
            b->local_world++;
        }
    }
    free(hosts);
    return 0;
}

/* UST_JOB_ID (a launcher's name for the job) or a random one. */
static int job_id_from_env(char *out, size_t cap, ust_err *e) {
    const char *id = getenv("UST_JOB_ID");
    if (!id || !*id) return boot_random_id(out, cap, "env"), 0;
    size_t n = strlen(id);
    int ok = n <= 40;
    for (size_t i = 0; i < n && ok; i++)
        ok = (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
             (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '.';
    if (!ok)
        return ust_errf(e,
                        "environment variable UST_JOB_ID='%s' is not up to 40 letters, digits, "
                        "'_' or '.'",
                        id);
    snprintf(out, cap, "%s", id);
    return 0;
}

/* The torchrun-style variables (each with whether it was set), checked against each other. */
typedef struct {
    long rank, world, lr, lw, gr, gw;
    int hlr, hlw, hgr, hgw; /* LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_/NODE_RANK, GROUP_WORLD_SIZE */
} env_vars;

static int env_read(env_vars *v, ust_err *e) {
    *v = (env_vars){0};
    int hr = boot_env_int("RANK", 0, INT_MAX - 1, &v->rank, e);
    int hw = hr < 0 ? -1 : boot_env_int("WORLD_SIZE", 1, INT_MAX, &v->world, e);
    if (hr < 0 || hw < 0) return -1;
    if (!hr || !hw)
        return ust_errf(e,
                        "torchrun-style launch needs both RANK and WORLD_SIZE in the "
                        "environment, but %s is not set",
                        hr ? "WORLD_SIZE" : "RANK");
    if (v->rank >= v->world)
        return ust_errf(e, "RANK=%ld is not below WORLD_SIZE=%ld", v->rank, v->world);
    v->hlr = boot_env_int("LOCAL_RANK", 0, INT_MAX - 1, &v->lr, e);
    v->hlw = v->hlr < 0 ? -1 : boot_env_int("LOCAL_WORLD_SIZE", 1, v->world, &v->lw, e);
    if (v->hlr < 0 || v->hlw < 0) return -1;
    if (v->hlr != v->hlw)
        return ust_errf(e, "LOCAL_RANK and LOCAL_WORLD_SIZE go together, but only %s is set",
                        v->hlr ? "LOCAL_RANK" : "LOCAL_WORLD_SIZE");
    if (v->hlr && v->lr >= v->lw)
        return ust_errf(e, "LOCAL_RANK=%ld is not below LOCAL_WORLD_SIZE=%ld", v->lr, v->lw);
    v->hgr = boot_env_int("GROUP_RANK", 0, INT_MAX - 1, &v->gr, e);
    if (v->hgr == 0) v->hgr = boot_env_int("NODE_RANK", 0, INT_MAX - 1, &v->gr, e);
    v->hgw = v->hgr < 0 ? -1 : boot_env_int("GROUP_WORLD_SIZE", 1, v->world, &v->gw, e);
    if (v->hgr < 0 || v->hgw < 0) return -1;
    if (v->hgr && v->hgw && v->gr >= v->gw)
        return ust_errf(e, "GROUP_RANK=%ld is not below GROUP_WORLD_SIZE=%ld", v->gr, v->gw);
    return 0;
}

/* Rank 0 serves the key-value store at addr:port. */
static int env_serve(ust_boot *b, const char *addr, long port, const char *secret, ust_err *e) {
    boot_impl *im = b->impl;
    char id[64];
    if (job_id_from_env(id, sizeof id, e) < 0) return -1;
    im->server = store_server_start_auth(addr, (int)port, b->world, id, secret, e);
    if (!im->server) return -1;
    if (!secret)
        fprintf(stderr,
                "ustrain: warning: UST_JOB_SECRET is not set: the bootstrap key-value store "
                "on %s accepts any process that can connect to it (scripts/ustrun sets a "
                "secret; elsewhere export the same UST_JOB_SECRET to every rank)\n",
                im->where);
    return 0;
}

/* Connects and says HELLO (which gives us the job id). Rank 0 may drop a connection before it
 * read our HELLO (it evicts the oldest silent ones when strangers crowd the store): connect
 * again until the deadline. */
static int env_connect(ust_boot *b, const char *addr, long port, const char *secret,
                       double deadline, ust_err *e) {
    boot_impl *im = b->impl;
    for (double backoff = 0.05;; backoff = backoff < 0.4 ? 2 * backoff : 0.8) {
        im->client = store_client_connect(addr, (int)port, deadline, e);
        if (!im->client) return -1;
        if (store_client_hello_auth(im->client, b->rank, b->world, secret, b->job_id,
                                    sizeof b->job_id, deadline, e) == 0)
            return 0;
        int again = store_client_lost(im->client) && log_now_s() + backoff < deadline;
        store_client_close(im->client, 0);
        im->client = NULL;
        if (!again) return -1;
        struct timespec ts = {0, (long)(backoff * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* Local rank/size and node: from LOCAL_RANK and friends when set, else from the hostnames every
 * rank published before the fence. */
static int env_place(ust_boot *b, const env_vars *v, ust_err *e) {
    if (!v->hlr) return derive_local_from_hosts(b, e);
    b->local_rank = (int)v->lr, b->local_world = (int)v->lw;
    b->nnodes = v->hgw ? (int)v->gw : (int)((v->world + v->lw - 1) / v->lw);
    b->node_id = v->hgr ? (int)v->gr : (int)(v->rank / v->lw);
    if (b->node_id >= b->nnodes)
        return ust_errf(e, "node %d (GROUP_RANK) is not below the number of nodes %d", b->node_id,
                        b->nnodes);
    return 0;
}

static int env_init(ust_boot *b, ust_err *e) {
    boot_impl *im = b->impl;
    env_vars v;
    long port = 0;
    if (env_read(&v, e)) return -1;
    b->kind = BOOT_ENV;
    b->rank = (int)v.rank, b->world = (int)v.world;
    if (v.world > 1) ust_error_set_rank(b->rank); /* so that even a failed join says who failed */
    const char *addr = getenv("MASTER_ADDR");
    if (addr && !*addr) addr = NULL;
    int hp = boot_env_int("MASTER_PORT", 1, 65535, &port, e);
    if (hp < 0) return -1;
    if (v.world == 1 && !addr && !hp) { /* nobody to meet: keep values locally */
        boot_random_id(b->job_id, sizeof b->job_id, "env");
        b->local_rank = 0, b->local_world = 1, b->node_id = 0, b->nnodes = 1;
        return 0;
    }
    if (!addr || !hp)
        return ust_errf(e,
                        "torchrun-style launch with WORLD_SIZE=%ld needs MASTER_ADDR and "
                        "MASTER_PORT (where rank 0 serves the key-value store), but %s is not set",
                        v.world, !addr ? "MASTER_ADDR" : "MASTER_PORT");
    snprintf(im->where, sizeof im->where, "%s:%ld", addr, port);

    double deadline = log_now_s() + b->timeout_s;
    const char *secret = getenv("UST_JOB_SECRET");
    if (secret && !*secret) secret = NULL;
    if (v.rank == 0 && env_serve(b, addr, port, secret, e)) return -1;
    if (env_connect(b, addr, port, secret, deadline, e)) return -1;
    if (!v.hlr) {
        char host[256];
        if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "?");
        host[sizeof host - 1] = 0;
        if (boot_put(b, "ust.host", host, strlen(host), e) < 0) return -1;
    }
    /* Everyone joined before anyone goes on: a missing rank is reported here, by name. */
    ust_err fe;
    double left = deadline - log_now_s();
    if (store_client_fence(im->client, im->fence_gen++, left > 0.1 ? left : 0.1, &fe) < 0)
        return ust_errf(e, "waiting for all %d ranks to join at %s: %s", b->world, im->where,
                        fe.msg);
    return env_place(b, &v, e);
}

/* ---------------------------------------------------------------- detection */

/* A launcher that started several tasks without giving us a way to meet them. */
static int launcher_says_many(char *what, size_t cap) {
    static const char *vars[] = {"SLURM_NTASKS", "SLURM_NPROCS", "OMPI_COMM_WORLD_SIZE",
                                 "PMI_SIZE",     "PMIX_SIZE",    "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atol(v) > 1) {
            snprintf(what, cap, "%s=%s", vars[i], v);
            return 1;
        }
    }
    return 0;
}

static int share_nodes(ust_boot *b, ust_err *e);

static void impl_free(ust_boot *b) {
    boot_impl *im = b->impl;
    if (!im) return;
    for (local_kv *x = im->kv, *nx; x; x = nx) {
        nx = x->next;
        free(x->key), free(x->val), free(x);
    }
    free(im);
    b->impl = NULL;
}

int boot_init(ust_boot *b, double timeout_s, ust_err *e) {
    memset(b, 0, sizeof *b);
    b->timeout_s = timeout_s > 0 ? timeout_s : 300;
    b->impl = calloc(1, sizeof *b->impl);
    if (!b->impl) return ust_errf(e, "out of memory");
    int r = 1;
    char pmix_why[400] = "";
    if (boot_pmix_available()) {
        r = boot_pmix_init(b, e); /* 1: no server, fall through */
        if (r == 1 && e) snprintf(pmix_why, sizeof pmix_why, " (%.380s)", e->msg);
    }
    if (r == 1) {
        const char *rk = getenv("RANK"), *ws = getenv("WORLD_SIZE");
        if ((rk && *rk) || (ws && *ws)) {
            r = env_init(b, e);
        } else {
            char what[128];
            if (launcher_says_many(what, sizeof what)) {
                r = ust_errf(e,
                             "started as a single process, but the launcher says there are "
                             "several tasks (%s) and no PMIx server is reachable%s: under "
                             "Slurm launch with `srun --mpi=pmix` (or set MpiDefault=pmix), "
                             "under OpenMPI with mpirun, or use scripts/ustrun",
                             what, pmix_why);
            } else {
                b->kind = BOOT_SINGLE;
                b->rank = 0, b->world = 1, b->local_rank = 0, b->local_world = 1;
                b->node_id = 0, b->nnodes = 1;
                boot_random_id(b->job_id, sizeof b->job_id, "single");
                r = 0;
            }
        }
    }
    if (r < 0) {
        boot_impl *im = b->impl;
        store_client_close(im->client, 0);
        store_server_stop(im->server, 0); /* wakes the others with this job's error, if any */
        if (im->pmix) boot_pmix_finalize(b);
        impl_free(b);
        return -1;
    }
    ust_error_set_rank(b->world > 1 ? b->rank : -1);
    if (b->nnodes > 1 && share_nodes(b, e)) {
        boot_finalize(b);
        return -1;
    }
    return 0;
}

/* Multi-node jobs: every rank learns the node of every other (the topology places groups by it,
 * comm gives the groups across nodes to gloo). One put, one fence, world gets per rank. */
static int share_nodes(ust_boot *b, ust_err *e) {
    b->node_of = malloc(sizeof(int) * (size_t)b->world);
    if (!b->node_of) return ust_errf(e, "out of memory");
    int32_t mine = b->node_id;
    if (boot_put(b, "ust.node", &mine, sizeof mine, e) < 0 || boot_fence(b, e) < 0) return -1;
    for (int r = 0; r < b->world; r++) {
        int32_t v;
        int n = boot_get(b, r, "ust.node", &v, sizeof v, e);
        if (n < 0) return -1;
        if (n != (int)sizeof v || v < 0 || v >= b->nnodes)
            return ust_errf(e, "bootstrap: rank %d says it is on node %d of %d", r, (int)v,
                            b->nnodes);
        b->node_of[r] = v;
    }
    return 0;
}

int boot_node_of(const ust_boot *b, int rank) {
    UST_ASSERT(rank >= 0 && rank < b->world, "rank %d of %d", rank, b->world);
    return b->node_of ? b->node_of[rank] : 0;
}

int boot_put(ust_boot *b, const char *key, const void *val, size_t len, ust_err *e) {
    if (key_ok(key, e) < 0) return -1;
    if (len > STORE_MAX_VAL)
        return ust_errf(e, "bootstrap put of key '%s': %zu bytes, more than the limit of %u", key,
                        len, STORE_MAX_VAL);
    boot_impl *im = b->impl;
    if (b->kind == BOOT_PMIX) return boot_pmix_put(b, key, val, len, e);
    if (im->client) return store_client_put(im->client, b->rank, key, val, len, b->timeout_s, e);
    return local_put(im, key, val, len, e);
}

int boot_fence(ust_boot *b, ust_err *e) {
    boot_impl *im = b->impl;
    if (b->kind == BOOT_PMIX) return boot_pmix_fence(b, e);
    if (im->client) return store_client_fence(im->client, im->fence_gen++, b->timeout_s, e);
    return 0;
}

int boot_get(ust_boot *b, int rank, const char *key, void *val, size_t cap, ust_err *e) {
    if (key_ok(key, e) < 0) return -1;
    if (rank < 0 || rank >= b->world)
        return ust_errf(e, "bootstrap get of key '%s' from rank %d, outside [0, %d)", key, rank,
                        b->world);
    boot_impl *im = b->impl;
    if (b->kind == BOOT_PMIX) return boot_pmix_get(b, rank, key, val, cap, e);
    if (im->client) return store_client_get(im->client, rank, key, val, cap, b->timeout_s, e);
    return local_get(im, key, val, cap, e);
}

void boot_finalize(ust_boot *b) {
    boot_impl *im = b->impl;
    free(b->node_of);
    b->node_of = NULL;
    if (!im) return;
    if (b->kind == BOOT_PMIX) boot_pmix_finalize(b);
    store_client_close(im->client, 1);
    /* Rank 0 keeps serving until every rank has left (bounded): a slower rank may still be
     * reading the values it needs. */
    store_server_stop(im->server, b->timeout_s);
    impl_free(b);
}
