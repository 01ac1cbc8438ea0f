/* Bootstrap tests.
 * Run with no launcher around it: unit tests of the single-process path, the store's wire format,
 * environment parsing errors, and the TCP store itself with client threads standing in for ranks.
 * Run under a launcher (RANK/WORLD_SIZE or PMIx in the environment, or with --ranks-check): every
 * rank puts a value, fences, reads everyone's value back and checks it, and checks that job id,
 * node and local ranks agree; prints "ranks-check ok ..." per rank and exits 0, or exits non-zero
 * with the bootstrap's message. Options for the fault tests:
 *   --timeout S     bootstrap timeout (default: $UST_TIMEOUT_S, else 30)
 *   --die-rank R    rank R kills itself with SIGKILL after joining, before the first fence */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"
#include "log.h"
#include "bootstrap_impl.h"
#include "test.h"

/* ---------------------------------------------------------------- single process */

static void clear_launcher_env(void) {
    static const char *vars[] = {
        "RANK",          "WORLD_SIZE",   "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",   "MASTER_PORT",  "GROUP_RANK",      "GROUP_WORLD_SIZE",
        "NODE_RANK",     "SLURM_NTASKS", "SLURM_NPROCS",    "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",      "PMIX_SIZE",    "MPI_LOCALNRANKS", "PMIX_RANK",
        "PMIX_NAMESPACE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

static void test_single_process_is_rank_0_of_1_with_a_local_store(void) {
    clear_launcher_env();
    ust_boot b, b2;
    ust_err e = {{0}};
    CHECK(boot_init(&b, 5, &e) == 0, "boot_init: %.900s", e.msg);
    CHECK(b.kind == BOOT_SINGLE && b.rank == 0 && b.world == 1, "kind %d rank %d world %d", b.kind,
          b.rank, b.world);
    CHECK(b.local_rank == 0 && b.local_world == 1 && b.node_id == 0 && b.nnodes == 1, "local");
    CHECK(strlen(b.job_id) > 8, "job id '%s'", b.job_id);
    CHECK(boot_put(&b, "answer", "42", 2, &e) == 0, "put: %.900s", e.msg);
    CHECK(boot_put(&b, "answer", "43!", 3, &e) == 0, "overwrite: %.900s", e.msg);
    CHECK(boot_fence(&b, &e) == 0, "fence: %.900s", e.msg);
    char v[16];
    CHECK(boot_get(&b, 0, "answer", v, sizeof v, &e) == 3 && !memcmp(v, "43!", 3), "get");
    CHECK(boot_get(&b, 0, "absent", v, sizeof v, &e) < 0 && strstr(e.msg, "absent"), "%.900s",
          e.msg);
    CHECK(boot_get(&b, 1, "answer", v, sizeof v, &e) < 0 && strstr(e.msg, "outside"), "%.900s",
          e.msg);
    CHECK(boot_get(&b, 0, "answer", v, 2, &e) < 0 && strstr(e.msg, "does not fit"), "%.900s",
          e.msg);
    CHECK(boot_put(&b, "has space", "x", 1, &e) < 0, "key with a space accepted");
    static char big[STORE_MAX_VAL + 1];
    CHECK(boot_put(&b, "big", big, sizeof big, &e) < 0 && strstr(e.msg, "limit"), "%.900s", e.msg);
    CHECK(boot_put(&b, "big", big, STORE_MAX_VAL, &e) == 0, "64 KiB put: %.900s", e.msg);
    CHECK(boot_init(&b2, 5, &e) == 0, "second boot_init: %.900s", e.msg);
    CHECK(strcmp(b.job_id, b2.job_id) != 0, "two runs share job id %s", b.job_id);
    boot_finalize(&b2);
    boot_finalize(&b);
}

/* ---------------------------------------------------------------- wire format */

static void test_store_frame_roundtrips_and_parses_incrementally(void) {
    uint8_t buf[512];
    size_t n = store_msg_encode(buf, sizeof buf, ST_PUT, 7, 9, "shm/dp/3", "hello", 5);
    CHECK(n == 4 + STORE_HDR + 8 + 5, "encoded size %zu", n);
    store_msg m;
    size_t used = 0;
    char why[256];
    /* Every strict prefix asks for more; the whole frame parses. */
    for (size_t k = 0; k < n; k++)
        CHECK(store_msg_parse(buf, k, &m, &used, why, sizeof why) == 0, "prefix %zu: %.900s", k,
              why);
    CHECK(store_msg_parse(buf, n, &m, &used, why, sizeof why) == 1, "%s", why);
    CHECK(used == n && m.op == ST_PUT && m.a == 7 && m.b == 9, "fields");
    CHECK(!strcmp(m.key, "shm/dp/3") && m.vallen == 5 && !memcmp(m.val, "hello", 5), "key/val");
    CHECK(store_msg_encode(buf, 10, ST_PUT, 0, 0, "k", "v", 1) == 0, "overflow not detected");
    CHECK(store_msg_encode(buf, sizeof buf, ST_PUT, 0, 0, "a b", "v", 1) == 0, "bad key encoded");
}

static void test_store_parser_rejects_every_malformed_frame(void) {
    uint8_t good[256], bad[256];
    size_t n = store_msg_encode(good, sizeof good, ST_GET, 1, 2, "key", "v", 1);
    store_msg m;
    size_t used;
    char why[256];
    struct {
        const char *what;
        size_t off;
        uint8_t byte;
    } cases[] = {
        {"bad magic", 4, 'X'},
        {"unknown op", 8, 99},
        {"zero op", 8, 0},
        {"nonzero flags", 9, 1},
        {"key length too long for the frame", 10, 200},
        {"value length inconsistent", 20, 9},
        {"non-printable key", 24, 0x01},
        {"space in key", 25, ' '},
        {"length below the header", 0, 3},
        {"huge length", 3, 0x7f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(bad, good, n);
        bad[cases[i].off] = cases[i].byte;
        why[0] = 0;
        CHECK(store_msg_parse(bad, n, &m, &used, why, sizeof why) == -1 && why[0], "%s: accepted",
              cases[i].what);
    }
    /* A foreign peer (e.g. an HTTP server on MASTER_PORT) is rejected from its first 8 bytes. */
    CHECK(store_msg_parse((const uint8_t *)"GET / HTTP/1.1\r\n", 16, &m, &used, why, sizeof why) ==
              -1,
          "HTTP accepted");
}

/* ---------------------------------------------------------------- environment parsing */

static int init_fails_with(const char *pattern, char *msg, size_t cap) {
    ust_boot b;
    ust_err e = {{0}};
    int r = boot_init(&b, 1, &e);
    if (r == 0) boot_finalize(&b);
    snprintf(msg, cap, "%s", r == 0 ? "(boot_init succeeded)" : e.msg);
    return r < 0 && strstr(e.msg, pattern) != NULL;
}

static void test_bad_launcher_environment_gives_a_message_naming_the_variable(void) {
    struct {
        const char *env[8]; /* NAME=VALUE */
        const char *pattern;
    } cases[] = {
        {{"RANK=abc", "WORLD_SIZE=2"}, "RANK='abc'"},
        {{"RANK=0", "WORLD_SIZE=0"}, "WORLD_SIZE='0'"},
        {{"RANK=2", "WORLD_SIZE=2"}, "RANK=2 is not below WORLD_SIZE=2"},
        {{"WORLD_SIZE=2"}, "RANK is not set"},
        {{"RANK=0"}, "WORLD_SIZE is not set"},
        {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"},
         "only LOCAL_RANK is set"},
        {{"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=29500"}, "MASTER_ADDR is not set"},
        {{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=70000"}, "MASTER_PORT"},
        {{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=no-such-host.invalid", "MASTER_PORT=29500"},
         "does not resolve"},
        {{"SLURM_NTASKS=4"}, "srun --mpi=pmix"},
        {{"OMPI_COMM_WORLD_SIZE=2"}, "OMPI_COMM_WORLD_SIZE=2"},
        /* PMIx variables but no server (e.g. inherited), while Slurm says there are 2 tasks. */
        {{"PMIX_RANK=0", "PMIX_NAMESPACE=ust-test-none", "SLURM_NTASKS=2"}, "PMIx_Init"},
    };
    char msg[2048];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        clear_launcher_env();
        for (int k = 0; cases[i].env[k]; k++) putenv((char *)cases[i].env[k]);
        int ok = init_fails_with(cases[i].pattern, msg, sizeof msg);
        clear_launcher_env();
        CHECK(ok, "case %zu: expected /%s/, got: %.900s", i, cases[i].pattern, msg);
    }
}

static void test_stale_pmix_variables_without_a_server_fall_through_to_single(void) {
    clear_launcher_env();
    putenv("PMIX_RANK=0");
    putenv("PMIX_NAMESPACE=ust-test-none");
    ust_boot b;
    ust_err e = {{0}};
    double t0 = log_now_s();
    int r = boot_init(&b, 1, &e);
    clear_launcher_env();
    CHECK(r == 0, "%.900s", e.msg);
    CHECK(b.kind == BOOT_SINGLE && b.world == 1, "kind %s world %d", boot_kind_name(b.kind),
          b.world);
    CHECK(log_now_s() - t0 < 1.0, "took %.2f s to find no PMIx server", log_now_s() - t0);
    boot_finalize(&b);
}

static void test_world_size_1_without_master_is_a_local_env_job(void) {
    clear_launcher_env();
    putenv("RANK=0");
    putenv("WORLD_SIZE=1");
    ust_boot b;
    ust_err e = {{0}};
    int r = boot_init(&b, 1, &e);
    clear_launcher_env();
    CHECK(r == 0, "%.900s", e.msg);
    CHECK(b.kind == BOOT_ENV && b.world == 1 && b.local_world == 1, "kind %d", b.kind);
    char v[4];
    CHECK(boot_put(&b, "k", "v", 1, &e) == 0 && boot_get(&b, 0, "k", v, 4, &e) == 1, "%.900s",
          e.msg);
    boot_finalize(&b);
}

/* ---------------------------------------------------------------- the TCP store, in process */

typedef struct {
    int port, rank, world, die_after_hello, bye;
    double timeout, sleep_before_get;
    int rc;
    char job[64];
    char err[2048];
    char got[8][64];
} fake_rank;

/* A rank of the env path without the environment: hello, put, fence, read every value. */
static void *fake_rank_main(void *arg) {
    fake_rank *f = arg;
    ust_err e = {{0}};
    f->rc = -1;
    store_client *c = store_client_connect("127.0.0.1", f->port, log_now_s() + f->timeout, &e);
    if (!c) goto out;
    if (store_client_hello(c, f->rank, f->world, f->job, sizeof f->job, log_now_s() + f->timeout,
                           &e) < 0)
        goto close;
    if (f->die_after_hello) {
        store_client_close(c, 0);
        f->rc = 0;
        return NULL;
    }
    char v[64];
    int n = snprintf(v, sizeof v, "value of rank %d", f->rank);
    if (store_client_put(c, f->rank, "k", v, (size_t)n, f->timeout, &e) < 0) goto close;
    if (store_client_fence(c, 0, f->timeout, &e) < 0) goto close;
    if (f->sleep_before_get > 0) usleep((useconds_t)(f->sleep_before_get * 1e6));
    for (int r = 0; r < f->world && r < 8; r++) {
        int k = store_client_get(c, r, "k", f->got[r], sizeof f->got[r] - 1, f->timeout, &e);
        if (k < 0) goto close;
        f->got[r][k] = 0;
    }
    f->rc = 0;
close:
    store_client_close(c, f->bye);
out:
    snprintf(f->err, sizeof f->err, "%.900s", e.msg);
    return NULL;
}

static store_server *start_store(int world, ust_err *e) {
    return store_server_start("127.0.0.1", 0, world, "test-job", e);
}

static void run_ranks(fake_rank *f, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fake_rank_main, &f[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void test_store_serves_four_ranks_put_fence_get(void) {
    ust_err e = {{0}};
    store_server *s = start_store(4, &e);
    CHECK(s, "%.900s", e.msg);
    fake_rank f[4];
    for (int i = 0; i < 4; i++)
        f[i] = (fake_rank){
            .port = store_server_port(s), .rank = i, .world = 4, .timeout = 5, .bye = 1};
    run_ranks(f, 4);
    double t0 = log_now_s();
    store_server_stop(s, 5);
    CHECK(log_now_s() - t0 < 1.0, "stop waited %.2f s although every rank had left",
          log_now_s() - t0);
    for (int i = 0; i < 4; i++) {
        CHECK(f[i].rc == 0, "rank %d: %.900s", i, f[i].err);
        CHECK(!strcmp(f[i].job, "test-job"), "rank %d job '%s'", i, f[i].job);
        for (int r = 0; r < 4; r++) {
            char want[64];
            snprintf(want, sizeof want, "value of rank %d", r);
            CHECK(!strcmp(f[i].got[r], want), "rank %d read '%s' from rank %d", i, f[i].got[r], r);
        }
    }
}

static void test_store_outlives_rank_0_until_every_rank_left(void) {
    ust_err e = {{0}};
    store_server *s = start_store(2, &e);
    CHECK(s, "%.900s", e.msg);
    fake_rank f[2] = {{.port = store_server_port(s), .rank = 0, .world = 2, .timeout = 5, .bye = 1},
                      {.port = store_server_port(s),
                       .rank = 1,
                       .world = 2,
                       .timeout = 5,
                       .bye = 1,
                       .sleep_before_get = 0.3}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, fake_rank_main, &f[i]);
    pthread_join(th[0], NULL);
    /* Rank 0 is done and stops its store while rank 1 has yet to read rank 0's value. */
    double t0 = log_now_s();
    store_server_stop(s, 5);
    double took = log_now_s() - t0;
    pthread_join(th[1], NULL);
    CHECK(f[0].rc == 0 && f[1].rc == 0, "rank 0: %.400s / rank 1: %.400s", f[0].err, f[1].err);
    CHECK(!strcmp(f[1].got[0], "value of rank 0"), "rank 1 read '%s'", f[1].got[0]);
    CHECK(took < 2.0, "stop took %.2f s", took);
}

static void test_store_fence_timeout_names_the_rank_that_never_came(void) {
    ust_err e = {{0}};
    store_server *s = start_store(3, &e);
    CHECK(s, "%.900s", e.msg);
    fake_rank f[2];
    for (int i = 0; i < 2; i++)
        f[i] = (fake_rank){
            .port = store_server_port(s), .rank = i, .world = 3, .timeout = 0.3, .bye = 1};
    double t0 = log_now_s();
    run_ranks(f, 2);
    double took = log_now_s() - t0;
    store_server_stop(s, 1);
    CHECK(took < 2.0, "fence returned after %.2f s with a 0.3 s timeout", took);
    for (int i = 0; i < 2; i++) {
        CHECK(f[i].rc < 0, "rank %d passed a fence with a rank missing", i);
        CHECK(strstr(f[i].err, "timed out") && strstr(f[i].err, "rank 2 (never connected"),
              "rank %d: %.900s", i, f[i].err);
    }
}

static void test_store_world_size_mismatch_fails_both_sides(void) {
    ust_err e = {{0}};
    store_server *s = start_store(2, &e);
    CHECK(s, "%.900s", e.msg);
    fake_rank f[2] = {
        {.port = store_server_port(s), .rank = 0, .world = 2, .timeout = 5, .bye = 1},
        {.port = store_server_port(s), .rank = 1, .world = 3, .timeout = 5, .bye = 1}};
    double t0 = log_now_s();
    run_ranks(f, 2);
    double took = log_now_s() - t0;
    store_server_stop(s, 1);
    CHECK(took < 2.0, "mismatch took %.2f s to report", took);
    for (int i = 0; i < 2; i++)
        CHECK(f[i].rc < 0 && strstr(f[i].err, "WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"),
              "rank %d: %.900s", i, f[i].err);
}

static void test_store_rank_that_dies_fails_the_fence_at_once(void) {
    ust_err e = {{0}};
    store_server *s = start_store(2, &e);
    CHECK(s, "%.900s", e.msg);
    fake_rank f[2] = {
        {.port = store_server_port(s), .rank = 0, .world = 2, .timeout = 5, .bye = 1},
        {.port = store_server_port(s), .rank = 1, .world = 2, .timeout = 5, .die_after_hello = 1}};
    double t0 = log_now_s();
    run_ranks(f, 2);
    double took = log_now_s() - t0;
    store_server_stop(s, 1);
    CHECK(took < 2.0, "a dead rank took %.2f s to notice (timeout 5 s)", took);
    CHECK(f[0].rc < 0 && strstr(f[0].err, "rank 1 (disconnected"), "rank 0: %.900s", f[0].err);
}

static void test_store_port_in_use_and_refused_connection_name_the_address(void) {
    ust_err e = {{0}};
    store_server *s = start_store(1, &e);
    CHECK(s, "%.900s", e.msg);
    int port = store_server_port(s);
    store_server *s2 = store_server_start("127.0.0.1", port, 1, "x", &e);
    CHECK(!s2 && strstr(e.msg, "already in use"), "second server on port %d: %.900s", port,
          s2 ? "started" : e.msg);
    store_server_stop(s, 0);
    /* The port is closed now: connecting is refused until the deadline. */
    double t0 = log_now_s();
    store_client *c = store_client_connect("127.0.0.1", port, log_now_s() + 0.3, &e);
    CHECK(!c, "connected to a closed port");
    CHECK(log_now_s() - t0 < 1.5, "refused connection took %.2f s", log_now_s() - t0);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    CHECK(strstr(e.msg, where) && strstr(e.msg, "refused"), "%.900s", e.msg);
}

static void test_store_drops_a_foreign_peer_and_keeps_serving(void) {
    ust_err e = {{0}};
    store_server *s = start_store(1, &e);
    CHECK(s, "%.900s", e.msg);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)store_server_port(s)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %.900s", strerror(errno));
    const char *junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(send(fd, junk, strlen(junk), MSG_NOSIGNAL) > 0, "send");
    char buf[16];
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(recv(fd, buf, sizeof buf, 0) == 0, "foreign peer not dropped");
    close(fd);
    fake_rank f = {.port = store_server_port(s), .rank = 0, .world = 1, .timeout = 5, .bye = 1};
    run_ranks(&f, 1);
    store_server_stop(s, 1);
    CHECK(f.rc == 0, "store stopped serving after a foreign peer: %.900s", f.err);
}

/* ---------------------------------------------------------------- multi-rank check */

static int ranks_check(double timeout, int die_rank) {
    ust_boot b;
    ust_err e = {{0}};
    if (boot_init(&b, timeout, &e) < 0) ust_fatal(UST_EXIT_USAGE, "%.900s", e.msg);
    printf("rank %d of %d: kind %s, local %d of %d, node %d of %d, job %s\n", b.rank, b.world,
           boot_kind_name(b.kind), b.local_rank, b.local_world, b.node_id, b.nnodes, b.job_id);
    fflush(stdout);
    if (b.rank == die_rank) raise(SIGKILL);
    /* What every rank publishes: its identity as text, and a 64 KiB pattern. */
    char me[256];
    int n = snprintf(me, sizeof me, "%d %d %d %d %s", b.rank, b.node_id, b.local_rank,
                     b.local_world, b.job_id);
    static uint8_t big[STORE_MAX_VAL], got_big[STORE_MAX_VAL];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7 + (size_t)b.rank);
    if (boot_put(&b, "id", me, (size_t)n, &e) < 0 || boot_put(&b, "big", big, sizeof big, &e) < 0)
        ust_fatal(UST_EXIT_RUNTIME, "%.900s", e.msg);
    if (boot_fence(&b, &e) < 0) ust_fatal(UST_EXIT_RUNTIME, "%.900s", e.msg);
    int *local_count = calloc((size_t)b.nnodes, sizeof *local_count);
    for (int r = 0; r < b.world; r++) {
        char v[256];
        int k = boot_get(&b, r, "id", v, sizeof v - 1, &e);
        if (k < 0) ust_fatal(UST_EXIT_RUNTIME, "%.900s", e.msg);
        v[k] = 0;
        int rr, node, lr, lw;
        char job[64];
        if (sscanf(v, "%d %d %d %d %63s", &rr, &node, &lr, &lw, job) != 5 || rr != r ||
            strcmp(job, b.job_id) || node < 0 || node >= b.nnodes || lr < 0 || lr >= lw)
            ust_fatal(UST_EXIT_RUNTIME, "rank %d published '%s' (my job id is %s)", r, v, b.job_id);
        if (node == b.node_id) local_count[node]++;
        k = boot_get(&b, r, "big", got_big, sizeof got_big, &e);
        if (k < 0) ust_fatal(UST_EXIT_RUNTIME, "%.900s", e.msg);
        for (size_t i = 0; i < sizeof big; i++)
            if (got_big[i] != (uint8_t)(i * 7 + (size_t)r))
                ust_fatal(UST_EXIT_RUNTIME, "64 KiB value of rank %d differs at byte %zu", r, i);
    }
    if (local_count[b.node_id] != b.local_world)
        ust_fatal(UST_EXIT_RUNTIME, "%d ranks say they are on node %d, local_world is %d",
                  local_count[b.node_id], b.node_id, b.local_world);
    free(local_count);
    /* A second round after the first fence: generations must not mix. */
    if (boot_put(&b, "round2", &b.rank, sizeof b.rank, &e) < 0 || boot_fence(&b, &e) < 0)
        ust_fatal(UST_EXIT_RUNTIME, "%.900s", e.msg);
    int peer = (b.rank + 1) % b.world, v = -1;
    if (boot_get(&b, peer, "round2", &v, sizeof v, &e) != (int)sizeof v || v != peer)
        ust_fatal(UST_EXIT_RUNTIME, "round 2: read %d from rank %d: %.900s", v, peer, e.msg);
    printf("ranks-check ok rank %d of %d kind %s job %s\n", b.rank, b.world, boot_kind_name(b.kind),
           b.job_id);
    fflush(stdout);
    boot_finalize(&b);
    return 0;
}

static int under_launcher(void) {
    return getenv("RANK") || getenv("WORLD_SIZE") || getenv("PMIX_RANK") ||
           getenv("PMIX_NAMESPACE");
}

int main(int argc, char **argv) {
    int check = 0, die_rank = -1;
    double timeout = getenv("UST_TIMEOUT_S") ? atof(getenv("UST_TIMEOUT_S")) : 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks-check"))
            check = 1;
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--die-rank") && i + 1 < argc)
            die_rank = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--ranks-check] [--timeout S] [--die-rank R]\n", argv[0]);
            return UST_EXIT_USAGE;
        }
    }
    if (check || under_launcher()) return ranks_check(timeout, die_rank);
    RUN_TEST(test_single_process_is_rank_0_of_1_with_a_local_store);
    RUN_TEST(test_store_frame_roundtrips_and_parses_incrementally);
    RUN_TEST(test_store_parser_rejects_every_malformed_frame);
    RUN_TEST(test_bad_launcher_environment_gives_a_message_naming_the_variable);
    RUN_TEST(test_stale_pmix_variables_without_a_server_fall_through_to_single);
    RUN_TEST(test_world_size_1_without_master_is_a_local_env_job);
    RUN_TEST(test_store_serves_four_ranks_put_fence_get);
    RUN_TEST(test_store_outlives_rank_0_until_every_rank_left);
    RUN_TEST(test_store_fence_timeout_names_the_rank_that_never_came);
    RUN_TEST(test_store_world_size_mismatch_fails_both_sides);
    RUN_TEST(test_store_rank_that_dies_fails_the_fence_at_once);
    RUN_TEST(test_store_port_in_use_and_refused_connection_name_the_address);
    RUN_TEST(test_store_drops_a_foreign_peer_and_keeps_serving);
    return TEST_SUMMARY();
}
