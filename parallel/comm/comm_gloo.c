/* comm_gloo: the gloo backend, for CPU groups whose members are on several nodes (comm.c picks it
 * per group; groups inside one node keep shared memory). gloo's TCP transport moves the data,
 * gloo's own algorithms run all-reduce, all-gather, broadcast and barrier; reduce-scatter is a
 * ring and all-to-all(v) and send/recv are batches of gloo's unbound-buffer transfers
 * (gloo_store.cc). Like shm, operations run in posting order when one is waited on, each bounded
 * by dist.timeout_s. bf16 travels as bf16 and is reduced in fp32 (converted at both ends).
 *
 * Addresses: one TCP device per process, listening on (first that applies) the interface
 * UST_GLOO_IFACE, the address UST_GLOO_ADDR, the local address that routes to MASTER_ADDR (so a
 * rank binds the interface its node reaches rank 0 by), or this host's name. Each member
 * publishes that address with the group, so a failure names the node it came from: a peer that
 * died closes its sockets, and the waiting members report its node at once instead of at the
 * deadline. Compiled only with -DUST_GLOO (Makefile: gloo/context.h found). */
#ifdef UST_GLOO

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm_impl.h"
#include "gloo_store.h"

enum { GLOO_HOST = 64 };

typedef struct {
    ugloo_dev *dev;
    char host[GLOO_HOST]; /* the address the device listens on, as text */
} gloo_ctx;

typedef struct {
    ugloo *g;
    char (*hosts)[GLOO_HOST]; /* every member's listening address */
    float *scratch;           /* fp32 staging of reductions (bf16, reduce-scatter) */
    size_t scap;              /* floats */
    ugloo_xfer *xfer;         /* the transfers of an all-to-all or send/recv batch */
    int xcap;
} gloo_comm;

/* The local address of a socket "connected" (UDP: no packet is sent) to host: the interface
 * the routing table uses to reach it. */
static int local_addr_towards(const char *host, char *out, size_t cap) {
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (getaddrinfo(host, "9", &hints, &ai) != 0 || !ai) return -1;
    int rc = -1, fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) == 0)
        rc = 0;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return rc;
}

/* The IPv4 (else IPv6) address of interface name, as text. */
static int iface_addr(const char *name, char *out, size_t cap) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return -1;
    int rc = -1;
    for (int fam = AF_INET; fam && rc; fam = fam == AF_INET ? AF_INET6 : 0)
        for (struct ifaddrs *i = ifs; i && rc; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == fam && !strcmp(i->ifa_name, name))
                rc = getnameinfo(i->ifa_addr,
                                 fam == AF_INET ? sizeof(struct sockaddr_in)
                                                : sizeof(struct sockaddr_in6),
                                 out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) == 0
                         ? 0
                         : -1;
    freeifaddrs(ifs);
    return rc;
}

static int gloo_ctx_init(comm_ctx *ctx, ust_err *e) {
    gloo_ctx *g = calloc(1, sizeof *g);
    UST_ASSERT(g, "out of memory");
    const char *iface = getenv("UST_GLOO_IFACE"), *addr = getenv("UST_GLOO_ADDR"),
               *master = getenv("MASTER_ADDR");
    char err[512];
    if (iface && !*iface) iface = NULL;
    if (iface) {
        if (iface_addr(iface, g->host, sizeof g->host)) {
            free(g);
            return ust_errf(e,
                            "comm/gloo: UST_GLOO_IFACE=%s: no interface of that name with an "
                            "address on this node",
                            iface);
        }
    } else if (addr && *addr) {
        snprintf(g->host, sizeof g->host, "%s", addr);
    } else if (!master || !*master || local_addr_towards(master, g->host, sizeof g->host)) {
        if (gethostname(g->host, sizeof g->host - 1))
            snprintf(g->host, sizeof g->host, "localhost");
    }
    g->dev = ugloo_dev_create(g->host, iface, err, sizeof err);
    if (!g->dev) {
        ust_errf(e, "comm/gloo: %s (address %s; choose it with UST_GLOO_IFACE or UST_GLOO_ADDR)",
                 err, g->host);
        free(g);
        return -1;
    }
    ctx->gloo = g;
    return 0;
}

static void gloo_ctx_free(comm_ctx *ctx) {
    gloo_ctx *g = ctx->gloo;
    if (!g) return;
    ugloo_dev_free(g->dev);
    free(g);
    ctx->gloo = NULL;
}

static int gloo_create_begin(ust_comm *c, const char *key, ust_err *e) {
    gloo_ctx *g = c->ctx->gloo;
    gloo_comm *s = calloc(1, sizeof *s);
    UST_ASSERT(s, "out of memory");
    c->impl = s;
    char k[256];
    snprintf(k, sizeof k, "%s.host", key);
    return boot_put(c->ctx->boot, k, g->host, strlen(g->host) + 1, e);
}

static int gloo_create_end(ust_comm *c, const char *key, ust_err *e) {
    gloo_ctx *g = c->ctx->gloo;
    gloo_comm *s = c->impl;
    char k[256], err[1024];
    s->hosts = calloc((size_t)c->size, sizeof *s->hosts);
    UST_ASSERT(s->hosts, "out of memory");
    snprintf(k, sizeof k, "%s.host", key);
    for (int j = 0; j < c->size; j++)
        if (boot_get(c->ctx->boot, c->granks[j], k, s->hosts[j], GLOO_HOST, e) < 0) return -1;
    snprintf(k, sizeof k, "%s.g", key);
    s->g = ugloo_connect(g->dev, c->ctx->boot, k, c->granks, c->rank, c->size,
                         c->ctx->opts.timeout_s, err, sizeof err);
    if (!s->g) return ust_errf(e, "comm/gloo: group '%s' (%s): %s", c->name, g->host, err);
    return 0;
}

/* The failure of an operation: names the node of every member whose address gloo's message
 * mentions (a peer that closed the connection), else every other member; a timeout is reported
 * as on the other backends (the "hang:" line, dist.timeout_s). */
_Noreturn static void fail(ust_comm *c, comm_kind k, const char *err) {
    gloo_comm *s = c->impl;
    int w[1024], n = 0;
    char why[2048];
    size_t used = 0;
    for (int j = 0; j < c->size && n < 1024; j++) {
        if (j == c->rank) continue;
        const char *h = s->hosts[j], *p = err;
        size_t hl = strlen(h);
        for (; hl && (p = strstr(p, h)); p += hl)
            if ((p == err || !((p[-1] >= '0' && p[-1] <= '9') || p[-1] == '.')) &&
                !((p[hl] >= '0' && p[hl] <= '9') || p[hl] == '.'))
                break;
        if (p) w[n++] = j;
    }
    used += (size_t)snprintf(why, sizeof why, "%s", err);
    for (int i = 0; i < n && used + 96 < sizeof why; i++) {
        int node = boot_node_of(c->ctx->boot, c->granks[w[i]]), seen = 0;
        for (int q = 0; q < i; q++) seen |= boot_node_of(c->ctx->boot, c->granks[w[q]]) == node;
        if (!seen)
            used += (size_t)snprintf(why + used, sizeof why - used, "%s node %d (%s)",
                                     i ? "," : "; lost the connection to", node, s->hosts[w[i]]);
    }
    if (!n) n = comm_other_members(c, w, 1024);
    /* gloo cannot tell which member kept it waiting: the hang line names every member */
    if (strstr(err, "imed out") || strstr(err, "imeout")) comm_fail_timeout(c, k, w, n);
    comm_fail_wait(c, k, w, n, why);
}

static float *scratch(gloo_comm *s, size_t n) {
    if (s->scap < n) {
        free(s->scratch);
        s->scratch = malloc(n * sizeof(float));
        UST_ASSERT(s->scratch, "out of memory (%zu floats)", n);
        s->scap = n;
    }
    return s->scratch;
}

static ugloo_xfer *xfers(gloo_comm *s, int n) {
    if (s->xcap < n) {
        free(s->xfer);
        s->xfer = malloc(sizeof *s->xfer * (size_t)n);
        UST_ASSERT(s->xfer, "out of memory (%d transfers)", n);
        s->xcap = n;
    }
    return s->xfer;
}

static void to_f32(float *out, const void *in, size_t n, comm_dtype t) {
    if (t == COMM_FP32) {
        if (out != in) memmove(out, in, n * 4);
        return;
    }
    const uint16_t *h = in;
    for (size_t i = 0; i < n; i++) out[i] = comm_bf16_to_f32(h[i]);
}

static void from_f32(void *out, const float *in, size_t n, comm_dtype t, float scale) {
    if (t == COMM_FP32) {
        float *o = out;
        for (size_t i = 0; i < n; i++) o[i] = in[i] * scale;
        return;
    }
    uint16_t *h = out;
    for (size_t i = 0; i < n; i++) h[i] = comm_f32_to_bf16(in[i] * scale);
}

/* A batch of point-to-point transfers. Sends to oneself pair with receives from oneself in
 * posting order: a copy. */
static int sendrecv(ust_comm *c, gloo_comm *s, const comm_desc *d, size_t es, char *err,
                    size_t errlen) {
    ugloo_xfer *x = xfers(s, d->np2p ? d->np2p : 1);
    int nx = 0, self_recv = 0;
    for (int i = 0; i < d->np2p; i++) {
        const comm_p2p *p = &d->p2p[i];
        if (p->peer != c->rank) {
            if (p->count) x[nx++] = (ugloo_xfer){p->peer, p->is_send, p->buf, p->count * es};
            continue;
        }
        if (!p->is_send) continue;
        while (self_recv < d->np2p &&
               (d->p2p[self_recv].peer != c->rank || d->p2p[self_recv].is_send))
            self_recv++;
        UST_ASSERT(self_recv < d->np2p && d->p2p[self_recv].count == p->count,
                   "send to oneself on '%s' without a matching receive", c->name);
        memcpy(d->p2p[self_recv].buf, p->buf, p->count * es);
        self_recv++;
    }
    return ugloo_batch(s->g, x, nx, 0, err, errlen);
}

static void run(ust_comm *c, const comm_desc *d) {
    gloo_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t), n = d->count;
    float scale = d->op == COMM_AVG ? 1.0f / (float)c->size : 1.0f;
    char err[1024];
    int rc = 0;
    /* Every member has the same count: an empty collective moves nothing (and gloo divides by
     * its element count). */
    if (n == 0 && d->kind != COMM_ALLTOALL && d->kind != COMM_SENDRECV && d->kind != COMM_BARRIER)
        return;
    switch (d->kind) {
    case COMM_ALLREDUCE: {
        float *x = d->t == COMM_FP32 ? d->recv : scratch(s, n);
        to_f32(x, d->send, n, d->t);
        rc = ugloo_allreduce_f32(s->g, x, n, err, sizeof err);
        if (!rc && (d->t != COMM_FP32 || scale != 1.0f)) from_f32(d->recv, x, n, d->t, scale);
        break;
    }
    case COMM_REDUCE_SCATTER: {
        float *x = scratch(s, (size_t)(c->size + 1) * n);
        to_f32(x, d->send, (size_t)c->size * n, d->t);
        rc = ugloo_reduce_scatter_f32(s->g, x, x + (size_t)c->size * n, n, err, sizeof err);
        if (!rc) from_f32(d->recv, x + (size_t)c->size * n, n, d->t, scale);
        break;
    }
    case COMM_ALLGATHER: {
        uint8_t *mine = (uint8_t *)d->recv + (size_t)c->rank * n * es;
        if ((const void *)mine != d->send) memmove(mine, d->send, n * es);
        rc = ugloo_allgather(s->g, d->recv, n * es, err, sizeof err);
        break;
    }
    case COMM_BROADCAST:
        rc = ugloo_broadcast(s->g, d->recv, n * es, d->root, err, sizeof err);
        break;
    case COMM_ALLTOALL: {
        ugloo_xfer *x = xfers(s, 2 * c->size);
        int nx = 0;
        for (int j = 0; j < c->size; j++) {
            const uint8_t *src = (const uint8_t *)d->send + desc_sdispl(d, j) * es;
            uint8_t *dst = (uint8_t *)d->recv + desc_rdispl(d, j) * es;
            if (j == c->rank) { /* the part kept locally */
                memcpy(dst, src, desc_scount(d, j) * es);
                continue;
            }
            if (desc_scount(d, j))
                x[nx++] = (ugloo_xfer){j, 1, (void *)src, desc_scount(d, j) * es};
            if (desc_rcount(d, j)) x[nx++] = (ugloo_xfer){j, 0, dst, desc_rcount(d, j) * es};
        }
        rc = ugloo_batch(s->g, x, nx, 1, err, sizeof err);
        break;
    }
    case COMM_SENDRECV:
        rc = sendrecv(c, s, d, es, err, sizeof err);
        break;
    case COMM_BARRIER:
        rc = ugloo_barrier(s->g, err, sizeof err);
        break;
    default:
        UST_ASSERT(0, "unknown operation %d", (int)d->kind);
    }
    if (rc) fail(c, d->kind, err);
}

static void gloo_wait_until(ust_comm *c, uint64_t seq) {
    while (c->done < seq) {
        run(c, &c->queue[(c->done + 1) % (uint64_t)c->qcap]);
        c->done++;
    }
}

static void gloo_free(ust_comm *c) {
    gloo_comm *s = c->impl;
    if (s->g) ugloo_free(s->g);
    free(s->hosts);
    free(s->scratch);
    free(s->xfer);
    free(s);
    c->impl = NULL;
}

/* Nothing moves at post time: gloo_wait_until runs the queue. */
#define gloo_launch NULL
#define FILL(op) .op = gloo_##op,
const comm_backend_ops comm_gloo_backend = {COMM_BACKEND_LIST(FILL)};
#undef FILL

#else
/* Without gloo this file is empty: comm.c keeps every group on shared memory and refuses a CPU
 * job that spans nodes. */
typedef int comm_gloo_not_built;
#endif
