/* The TCP key-value store of the torchrun-style launch path.
 *
 * Rank 0 runs store_server on a thread: one poll() loop over the listening socket and one
 * connection per rank (rank 0 connects to itself like everyone else). Requests are answered at
 * once when they can be; a GET of a key nobody has put yet, or a FENCE not every rank has reached,
 * is parked on its connection and answered when the state changes, when its wait expires
 * (TIMEOUT, with the names of what is missing) or when a rank it depends on leaves (ERR). So the
 * clients never poll: they sleep in poll() on their socket until the one reply arrives.
 * A rank that joins with a different WORLD_SIZE, a rank number out of range or a rank number
 * already taken poisons the job: every later request of every rank is answered with that error,
 * so the mistake is reported on all sides. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_impl.h"

double boot_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- wire format */

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16),
    p[3] = (uint8_t)(v >> 24);
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int store_key_valid(const char *key) {
    size_t n = 0;
    for (; key[n]; n++)
        if (key[n] <= ' ' || key[n] > '~') return 0;
    return n >= 1 && n <= STORE_MAX_KEY;
}

static int op_known(uint8_t op) {
    return (op >= ST_HELLO && op <= ST_BYE) || (op >= ST_OK && op <= ST_ERR);
}

size_t store_msg_encode(uint8_t *out, size_t cap, uint8_t op, uint32_t a, uint32_t b,
                        const char *key, const void *val, uint32_t vallen) {
    size_t kl = key ? strlen(key) : 0;
    if (kl > STORE_MAX_KEY || vallen > STORE_MAX_VAL || (kl && !store_key_valid(key))) return 0;
    size_t total = 4 + STORE_HDR + kl + vallen;
    if (total > cap) return 0;
    put32(out, (uint32_t)(total - 4));
    put32(out + 4, STORE_MAGIC);
    out[8] = op;
    out[9] = 0;
    out[10] = (uint8_t)kl, out[11] = (uint8_t)(kl >> 8);
    put32(out + 12, a);
    put32(out + 16, b);
    put32(out + 20, vallen);
    if (kl) memcpy(out + 24, key, kl);
    if (vallen) memcpy(out + 24 + kl, val, vallen);
    return total;
}

int store_msg_parse(const uint8_t *buf, size_t n, store_msg *m, size_t *used, char *why,
                    size_t whylen) {
    if (n < 4) return 0;
    uint32_t len = get32(buf);
    if (len < STORE_HDR || len > STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL) {
        snprintf(why, whylen, "frame length %u outside [%u, %u]", len, STORE_HDR,
                 STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL);
        return -1;
    }
    /* Check the magic as soon as it is there, so a foreign peer is rejected without waiting. */
    if (n >= 8 && get32(buf + 4) != STORE_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x (not a ustrain store peer)", get32(buf + 4));
        return -1;
    }
    if (n < 4 + (size_t)len) return 0;
    const uint8_t *p = buf + 4;
    uint8_t op = p[4];
    uint32_t kl = (uint32_t)p[6] | (uint32_t)p[7] << 8;
    uint32_t vl = get32(p + 16);
    if (!op_known(op)) return snprintf(why, whylen, "unknown op %u", op), -1;
    if (p[5] != 0) return snprintf(why, whylen, "nonzero flags 0x%02x", p[5]), -1;
    if (kl > STORE_MAX_KEY)
        return snprintf(why, whylen, "key length %u > %u", kl, STORE_MAX_KEY), -1;
    if (vl > STORE_MAX_VAL)
        return snprintf(why, whylen, "value length %u > %u", vl, STORE_MAX_VAL), -1;
    if ((uint64_t)STORE_HDR + kl + vl != len) {
        snprintf(why, whylen, "frame length %u != header %u + key %u + value %u", len, STORE_HDR,
                 kl, vl);
        return -1;
    }
    m->op = op;
    m->a = get32(p + 8);
    m->b = get32(p + 12);
    memcpy(m->key, p + 20, kl);
    m->key[kl] = 0;
    if (kl && !store_key_valid(m->key))
        return snprintf(why, whylen, "key has a byte outside printable ASCII"), -1;
    m->val = p + 20 + kl;
    m->vallen = vl;
    *used = 4 + (size_t)len;
    return 1;
}

/* Sends all of buf before the deadline (the peer may be slow to read a 64 KiB value). */
static int send_all(int fd, const uint8_t *buf, size_t n, double deadline) {
    size_t off = 0;
    while (off < n) {
        ssize_t k = send(fd, buf + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            double left = deadline - boot_now();
            if (left <= 0) return errno = ETIMEDOUT, -1;
            struct pollfd pf = {fd, POLLOUT, 0};
            poll(&pf, 1, (int)(left * 1000) + 1);
            continue;
        }
        return -1;
    }
    return 0;
}

/* Growable receive buffer of one connection. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} rbuf;

/* Reads what is available; returns bytes read, 0 on orderly close, -1 on error (EAGAIN: none). */
static ssize_t rbuf_fill(rbuf *r, int fd) {
    if (r->cap - r->len < 65536) {
        size_t nc = r->cap ? r->cap * 2 : 131072;
        uint8_t *np = realloc(r->p, nc);
        if (!np) return errno = ENOMEM, -1;
        r->p = np, r->cap = nc;
    }
    ssize_t k;
    do k = recv(fd, r->p + r->len, r->cap - r->len, MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k > 0) r->len += (size_t)k;
    return k;
}

static void rbuf_consume(rbuf *r, size_t n) {
    if (n == 0) return;
    memmove(r->p, r->p + n, r->len - n);
    r->len -= n;
}

/* ---------------------------------------------------------------- server */

typedef struct entry {
    struct entry *next;
    int rank;
    char *key;
    uint8_t *val;
    uint32_t len;
} entry;

#define NBUCKET 4096

typedef struct {
    int fd;
    int rank; /* -1 until HELLO */
    int said_bye;
    rbuf in;
    /* the one parked request of this connection, if any */
    int parked;
    uint8_t pop;
    uint32_t pa;
    char pkey[STORE_MAX_KEY + 1];
    double pdeadline;
} conn;

struct store_server {
    int lfd, wake[2];
    pthread_t th;
    int world, port;
    char job_id[64];
    char where[300];
    conn *conns;
    int nconn, capconn;
    entry *bucket[NBUCKET];
    uint32_t *next_gen; /* rank r has arrived at every fence < next_gen[r] */
    uint32_t min_next_gen;
    uint8_t *joined, *present, *died;
    int n_left; /* ranks that joined and left */
    char job_error[1024];
    int stopping; /* rank 0 finalized: serve until every rank left or stop_deadline */
    double stop_deadline;
    int closing;  /* the thread is ending: parked requests get an error now */
    uint8_t *out; /* reply scratch */
};

static uint32_t key_hash(int rank, const char *key) {
    uint32_t h = 2166136261u ^ (uint32_t)rank;
    for (; *key; key++) h = (h ^ (uint8_t)*key) * 16777619u;
    return h % NBUCKET;
}

static entry *kv_find(store_server *s, int rank, const char *key) {
    for (entry *x = s->bucket[key_hash(rank, key)]; x; x = x->next)
        if (x->rank == rank && !strcmp(x->key, key)) return x;
    return NULL;
}

static int kv_put(store_server *s, int rank, const char *key, const uint8_t *val, uint32_t len) {
    entry *x = kv_find(s, rank, key);
    uint8_t *nv = malloc(len ? len : 1);
    if (!nv) return -1;
    if (len) memcpy(nv, val, len);
    if (!x) {
        x = calloc(1, sizeof *x);
        char *k = strdup(key);
        if (!x || !k) return free(x), free(k), free(nv), -1;
        x->rank = rank, x->key = k;
        uint32_t h = key_hash(rank, key);
        x->next = s->bucket[h];
        s->bucket[h] = x;
    } else {
        free(x->val);
    }
    x->val = nv, x->len = len;
    return 0;
}

static void reply(store_server *s, conn *c, uint8_t op, const void *val, uint32_t len) {
    size_t n = store_msg_encode(s->out, 4 + STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL, op, 0, 0,
                                NULL, val, len);
    if (n == 0 || send_all(c->fd, s->out, n, boot_now() + 10.0) < 0) {
        /* The client is gone or stuck; its disconnect is noticed by the poll loop. */
        shutdown(c->fd, SHUT_RDWR);
    }
}

static void reply_text(store_server *s, conn *c, uint8_t op, const char *text) {
    reply(s, c, op, text, (uint32_t)strlen(text));
}

static void poison(store_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void poison(store_server *s, const char *fmt, ...) {
    if (s->job_error[0]) return; /* keep the first cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->job_error, sizeof s->job_error, fmt, ap);
    va_end(ap);
}

/* Describes the ranks that have not reached fence gen, at most 16 by name. */
static void describe_missing(store_server *s, uint32_t gen, char *out, size_t cap) {
    int nmiss = 0, shown = 0;
    size_t o = 0;
    for (int r = 0; r < s->world; r++)
        if (s->next_gen[r] <= gen) nmiss++;
    o += (size_t)snprintf(out + o, cap - o, "%d of %d ranks did not arrive:", nmiss, s->world);
    for (int r = 0; r < s->world && o < cap; r++) {
        if (s->next_gen[r] > gen) continue;
        if (shown++ == 16) {
            o += (size_t)snprintf(out + o, cap - o, " ...");
            break;
        }
        const char *st = !s->joined[r]                  ? "never connected to the store"
                         : !s->present[r] && s->died[r] ? "disconnected (died?)"
                         : !s->present[r]               ? "left the job (finalized)"
                                                        : "connected, not at this fence yet";
        o += (size_t)snprintf(out + o, cap - o, "%s rank %d (%s)", shown > 1 ? "," : "", r, st);
    }
}

/* Tries to answer c's parked request; returns 1 when answered. */
static int try_answer(store_server *s, conn *c, double now) {
    char msg[1536];
    if (s->job_error[0]) {
        reply_text(s, c, ST_ERR, s->job_error);
        return 1;
    }
    if (c->pop == ST_GET) {
        int owner = (int)c->pa;
        entry *x = kv_find(s, owner, c->pkey);
        if (x) {
            reply(s, c, ST_VAL, x->val, x->len);
            return 1;
        }
        if (s->joined[owner] && !s->present[owner]) {
            snprintf(msg, sizeof msg, "rank %d %s without putting key '%s'", owner,
                     s->died[owner] ? "disconnected from the store (died?)" : "left the job",
                     c->pkey);
            reply_text(s, c, ST_ERR, msg);
            return 1;
        }
        if (now >= c->pdeadline || s->closing) {
            snprintf(msg, sizeof msg, "rank %d has not put key '%s' (%s)%s", owner, c->pkey,
                     s->joined[owner] ? "it is connected" : "it never connected to the store",
                     s->closing ? "; rank 0 closed the store" : "");
            reply_text(s, c, s->closing ? ST_ERR : ST_TIMEOUT, msg);
            return 1;
        }
        return 0;
    }
    /* ST_FENCE */
    uint32_t gen = c->pa;
    if (s->min_next_gen > gen) {
        reply(s, c, ST_OK, NULL, 0);
        return 1;
    }
    int gone = 0;
    if (s->n_left)
        for (int r = 0; r < s->world; r++)
            if (s->next_gen[r] <= gen && s->joined[r] && !s->present[r]) gone = 1;
    if (gone || now >= c->pdeadline || s->closing) {
        describe_missing(s, gen, msg, sizeof msg);
        reply_text(s, c, gone || s->closing ? ST_ERR : ST_TIMEOUT, msg);
        return 1;
    }
    return 0;
}

static void answer_parked(store_server *s) {
    double now = boot_now();
    for (int i = 0; i < s->nconn; i++)
        if (s->conns[i].parked && try_answer(s, &s->conns[i], now)) s->conns[i].parked = 0;
}

static void conn_close(store_server *s, int i) {
    conn *c = &s->conns[i];
    if (c->rank >= 0) {
        s->present[c->rank] = 0;
        s->died[c->rank] = !c->said_bye;
        s->n_left++;
    }
    close(c->fd);
    free(c->in.p);
    s->conns[i] = s->conns[--s->nconn];
}

/* Handles one request; returns -1 when the connection must be closed. */
static int handle(store_server *s, conn *c, const store_msg *m) {
    char msg[1536];
    if (c->parked) return -1; /* one request at a time: a second one is a protocol error */
    if (m->op == ST_HELLO) {
        int rank = (int)m->a, world = (int)m->b;
        if (c->rank >= 0) return reply_text(s, c, ST_ERR, "HELLO sent twice"), -1;
        if (world != s->world)
            poison(s,
                   "rank %d joined with WORLD_SIZE=%d but rank 0 has WORLD_SIZE=%d; every rank "
                   "must be started with the same WORLD_SIZE",
                   rank, world, s->world);
        else if (rank < 0 || rank >= s->world)
            poison(s, "a process joined as rank %d, outside [0, %d)", rank, s->world);
        else if (s->joined[rank])
            poison(s, "rank %d joined twice: two processes have RANK=%d", rank, rank);
        if (s->job_error[0]) {
            reply_text(s, c, ST_ERR, s->job_error);
            answer_parked(s);
            return 0;
        }
        c->rank = rank;
        s->joined[rank] = s->present[rank] = 1;
        reply_text(s, c, ST_OK, s->job_id);
        return 0;
    }
    if (c->rank < 0) return reply_text(s, c, ST_ERR, "request before HELLO"), -1;
    if (m->op == ST_BYE) {
        c->said_bye = 1;
        reply(s, c, ST_OK, NULL, 0);
        return 0;
    }
    if (s->job_error[0]) return reply_text(s, c, ST_ERR, s->job_error), 0;
    switch (m->op) {
    case ST_PUT:
        if ((int)m->a != c->rank || !m->key[0])
            return reply_text(s, c, ST_ERR, "PUT for another rank or without a key"), -1;
        if (kv_put(s, c->rank, m->key, m->val, m->vallen) < 0)
            return reply_text(s, c, ST_ERR, "store out of memory"), 0;
        reply(s, c, ST_OK, NULL, 0);
        answer_parked(s);
        return 0;
    case ST_GET:
        if ((int)m->a < 0 || (int)m->a >= s->world || !m->key[0]) {
            snprintf(msg, sizeof msg, "GET of rank %d outside [0, %d)", (int)m->a, s->world);
            return reply_text(s, c, ST_ERR, msg), 0;
        }
        break;
    case ST_FENCE:
        if (m->a != s->next_gen[c->rank]) {
            snprintf(msg, sizeof msg, "rank %d entered fence %u but the store expected fence %u",
                     c->rank, m->a, s->next_gen[c->rank]);
            return reply_text(s, c, ST_ERR, msg), -1;
        }
        s->next_gen[c->rank] = m->a + 1;
        if (s->next_gen[c->rank] - 1 == s->min_next_gen) {
            uint32_t mn = UINT32_MAX;
            for (int r = 0; r < s->world; r++)
                if (s->next_gen[r] < mn) mn = s->next_gen[r];
            s->min_next_gen = mn;
        }
        break;
    default:
        return reply_text(s, c, ST_ERR, "not a request"), -1;
    }
    /* GET or FENCE: park, then see whether it (or anything else) can be answered now. */
    c->parked = 1;
    c->pop = m->op;
    c->pa = m->a;
    snprintf(c->pkey, sizeof c->pkey, "%s", m->key);
    c->pdeadline = boot_now() + m->b / 1000.0;
    answer_parked(s);
    return 0;
}

static int count_present(store_server *s) {
    int n = 0;
    for (int i = 0; i < s->nconn; i++) n += s->conns[i].rank >= 0;
    return n;
}

static void *server_main(void *arg) {
    store_server *s = arg;
    struct pollfd *pf = NULL;
    int cap_pf = 0;
    for (;;) {
        double now = boot_now();
        if (s->stopping && (count_present(s) == 0 || now >= s->stop_deadline)) break;
        double next = s->stopping ? s->stop_deadline : now + 3600;
        for (int i = 0; i < s->nconn; i++)
            if (s->conns[i].parked && s->conns[i].pdeadline < next) next = s->conns[i].pdeadline;
        int tmo = next <= now ? 0 : (int)((next - now) * 1000) + 1;
        if (cap_pf < s->nconn + 2) {
            cap_pf = 2 * (s->nconn + 2);
            struct pollfd *np = realloc(pf, (size_t)cap_pf * sizeof *pf);
            if (!np) break;
            pf = np;
        }
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){s->lfd, POLLIN, 0};
        for (int i = 0; i < s->nconn; i++) pf[2 + i] = (struct pollfd){s->conns[i].fd, POLLIN, 0};
        int nfd = 2 + s->nconn;
        if (poll(pf, (nfds_t)nfd, tmo) < 0 && errno != EINTR) break;
        if (pf[0].revents) {
            double wait_s;
            if (read(s->wake[0], &wait_s, sizeof wait_s) == (ssize_t)sizeof wait_s) {
                s->stopping = 1;
                s->stop_deadline = boot_now() + wait_s;
            }
        }
        /* Connections first (indices shift when one closes, so walk from the end). */
        for (int i = nfd - 3; i >= 0; i--) {
            if (!pf[2 + i].revents) continue;
            conn *c = &s->conns[i];
            ssize_t k = rbuf_fill(&c->in, c->fd);
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            int drop = k <= 0;
            while (!drop) {
                store_msg m;
                size_t used;
                char why[256];
                int r = store_msg_parse(c->in.p, c->in.len, &m, &used, why, sizeof why);
                if (r == 0) break;
                if (r < 0) {
                    fprintf(stderr, "ustrain: bootstrap store: dropping a connection: %s\n", why);
                    drop = 1;
                    break;
                }
                if (handle(s, c, &m) < 0) drop = 1;
                rbuf_consume(&c->in, used);
            }
            if (drop) {
                conn_close(s, i);
                answer_parked(s);
            }
        }
        if (pf[1].revents & POLLIN) {
            int fd = accept(s->lfd, NULL, NULL);
            if (fd >= 0) {
                if (s->nconn >= s->world + 64) {
                    close(fd); /* more connections than ranks: someone else is knocking */
                } else {
                    if (s->nconn == s->capconn) {
                        s->capconn = s->capconn ? 2 * s->capconn : 16;
                        conn *nc = realloc(s->conns, (size_t)s->capconn * sizeof *nc);
                        if (!nc) break;
                        s->conns = nc;
                    }
                    int one = 1;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    s->conns[s->nconn++] = (conn){.fd = fd, .rank = -1};
                }
            }
        }
        answer_parked(s); /* expired waits */
    }
    s->closing = 1;
    answer_parked(s);
    while (s->nconn) conn_close(s, s->nconn - 1);
    free(pf);
    return NULL;
}

static void server_free(store_server *s) {
    if (s->lfd >= 0) close(s->lfd);
    if (s->wake[0] >= 0) close(s->wake[0]), close(s->wake[1]);
    for (int h = 0; h < NBUCKET; h++)
        for (entry *x = s->bucket[h], *nx; x; x = nx) {
            nx = x->next;
            free(x->key), free(x->val), free(x);
        }
    free(s->conns), free(s->next_gen), free(s->joined), free(s->present), free(s->died);
    free(s->out);
    free(s);
}

store_server *store_server_start(const char *host, int port, int world, const char *job_id,
                                 ust_err *e) {
    store_server *s = calloc(1, sizeof *s);
    if (!s) return ust_errf(e, "out of memory"), NULL;
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->world = world;
    snprintf(s->job_id, sizeof s->job_id, "%s", job_id);
    snprintf(s->where, sizeof s->where, "%s:%d", host, port);
    s->next_gen = calloc((size_t)world, sizeof *s->next_gen);
    s->joined = calloc((size_t)world, 1), s->present = calloc((size_t)world, 1);
    s->died = calloc((size_t)world, 1);
    s->out = malloc(4 + STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL);
    if (!s->next_gen || !s->joined || !s->present || !s->died || !s->out)
        return server_free(s), ust_errf(e, "out of memory"), NULL;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) {
        ust_errf(e, "MASTER_ADDR '%s' does not resolve: %s", host, gai_strerror(g));
        return server_free(s), NULL;
    }
    s->lfd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s->lfd >= 0) setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->lfd < 0 || bind(s->lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(s->lfd, 1024) < 0) {
        int err = errno;
        char addr[NI_MAXHOST] = "?";
        getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, sizeof addr, NULL, 0, NI_NUMERICHOST);
        freeaddrinfo(ai);
        server_free(s);
        if (err == EADDRINUSE)
            ust_errf(e,
                     "MASTER_PORT %d is already in use on %s (%s): another job or process "
                     "holds it; pick a free port (MASTER_PORT, or ustrun --master-port)",
                     port, host, addr);
        else if (err == EADDRNOTAVAIL)
            ust_errf(e,
                     "MASTER_ADDR %s (%s) is not an address of this machine, but rank 0 "
                     "serves the key-value store there; start rank 0 on the host "
                     "MASTER_ADDR names",
                     host, addr);
        else
            ust_errf(e, "cannot serve the key-value store on %s:%d (%s): %s", host, port, addr,
                     strerror(err));
        return NULL;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    s->port = port;
    if (getsockname(s->lfd, (struct sockaddr *)&sa, &sl) == 0)
        s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    if (pipe2(s->wake, O_CLOEXEC) < 0)
        return server_free(s), ust_errf(e, "pipe: %s", strerror(errno)), NULL;
    /* The thread blocks every signal, so SIGTERM/SIGUSR1 (graceful stop) reach the main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&s->th, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) return server_free(s), ust_errf(e, "pthread_create: %s", strerror(err)), NULL;
    return s;
}

int store_server_port(const store_server *s) {
    return s->port;
}

void store_server_stop(store_server *s, double wait_s) {
    if (!s) return;
    if (write(s->wake[1], &wait_s, sizeof wait_s) != (ssize_t)sizeof wait_s) {
        /* cannot happen with an open pipe; the thread would then only stop at process exit */
    }
    pthread_join(s->th, NULL);
    server_free(s);
}

/* ---------------------------------------------------------------- client */

struct store_client {
    int fd;
    char where[300];
    rbuf in;
    size_t last_reply; /* bytes of the previous reply still in `in` (its value was handed out) */
    uint8_t *out;
    pthread_mutex_t mu;
};

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

store_client *store_client_connect(const char *host, int port, double deadline, ust_err *e) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0)
        return ust_errf(e, "MASTER_ADDR '%s' does not resolve: %s", host, gai_strerror(g)), NULL;
    double backoff = 0.02, t0 = boot_now();
    int last = 0, fd = -1;
    for (;;) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            break;
        }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r < 0 && errno == EINPROGRESS) {
            double left = deadline - boot_now();
            struct pollfd pf = {fd, POLLOUT, 0};
            int k = poll(&pf, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
            socklen_t sl = sizeof last;
            if (k == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &last, &sl) == 0 && last == 0)
                r = 0;
            else if (k == 0)
                last = ETIMEDOUT;
        } else if (r < 0) {
            last = errno;
        }
        if (r == 0) break;
        close(fd);
        fd = -1;
        if (boot_now() + backoff > deadline) break;
        sleep_s(backoff); /* rank 0 may simply not be listening yet */
        if (backoff < 0.5) backoff *= 2;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return ust_errf(e,
                        "could not connect to the key-value store of rank 0 at %s:%d "
                        "(MASTER_ADDR:MASTER_PORT) within %.1f s: %s; is rank 0 running, and do "
                        "all ranks have the same MASTER_ADDR and MASTER_PORT?",
                        host, port, boot_now() - t0, strerror(last ? last : ETIMEDOUT)),
               NULL;
    store_client *c = calloc(1, sizeof *c);
    if (c) c->out = malloc(4 + STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL);
    if (!c || !c->out) return close(fd), free(c), ust_errf(e, "out of memory"), NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    snprintf(c->where, sizeof c->where, "%s:%d", host, port);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

/* One request and its reply, which is waited for until wait_deadline. The reply's value points
 * into c->in and is valid until the next request. */
static int request(store_client *c, uint8_t op, uint32_t a, uint32_t b, const char *key,
                   const void *val, uint32_t vallen, double wait_deadline, store_msg *rep,
                   ust_err *e) {
    size_t n = store_msg_encode(c->out, 4 + STORE_HDR + STORE_MAX_KEY + STORE_MAX_VAL, op, a, b,
                                key, val, vallen);
    if (!n) return ust_errf(e, "bootstrap: key or value out of limits");
    rbuf_consume(&c->in, c->last_reply);
    c->last_reply = 0;
    if (c->in.len) return ust_errf(e, "bootstrap store at %s sent an unexpected message", c->where);
    if (send_all(c->fd, c->out, n, boot_now() + 30.0) < 0)
        return ust_errf(e, "lost the connection to the key-value store at %s (rank 0 exited?): %s",
                        c->where, strerror(errno));
    for (;;) {
        size_t used;
        char why[256];
        int r = store_msg_parse(c->in.p, c->in.len, rep, &used, why, sizeof why);
        if (r < 0)
            return ust_errf(e, "bad reply from the key-value store at %s: %s", c->where, why);
        if (r > 0) {
            /* Keep the bytes until the caller copied the value; the next request drops them. */
            if (used != c->in.len)
                return ust_errf(e, "key-value store at %s sent more than one reply", c->where);
            if (rep->op < ST_OK)
                return ust_errf(e, "key-value store at %s sent a request as a reply", c->where);
            c->last_reply = used;
            return 0;
        }
        double left = wait_deadline - boot_now();
        if (left <= 0)
            return ust_errf(e, "the key-value store at %s did not answer in time", c->where);
        struct pollfd pf = {c->fd, POLLIN, 0};
        int k = poll(&pf, 1, (int)(left * 1000) + 1);
        if (k < 0 && errno != EINTR) return ust_errf(e, "poll: %s", strerror(errno));
        if (k <= 0) continue;
        ssize_t got = rbuf_fill(&c->in, c->fd);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return ust_errf(e,
                            "lost the connection to the key-value store at %s (rank 0 exited?)%s%s",
                            c->where, got < 0 ? ": " : "", got < 0 ? strerror(errno) : "");
    }
}

static uint32_t wait_ms(double timeout_s) {
    double ms = timeout_s * 1000.0;
    return ms < 0 ? 0 : ms > 4.0e9 ? 4000000000u : (uint32_t)ms;
}

/* Text replies (ERR, TIMEOUT) into a C string. */
static const char *rep_text(const store_msg *m, char *buf, size_t cap) {
    size_t n = m->vallen < cap - 1 ? m->vallen : cap - 1;
    memcpy(buf, m->val, n);
    buf[n] = 0;
    return buf;
}

int store_client_hello(store_client *c, int rank, int world, char *job_id, size_t cap,
                       double deadline, ust_err *e) {
    store_msg m;
    char t[1100];
    pthread_mutex_lock(&c->mu);
    int r = request(c, ST_HELLO, (uint32_t)rank, (uint32_t)world, NULL, NULL, 0, deadline, &m, e);
    if (r == 0 && m.op != ST_OK)
        r = ust_errf(e, "rank %d could not join the job at %s: %s", rank, c->where,
                     rep_text(&m, t, sizeof t));
    if (r == 0) {
        if (m.vallen == 0 || m.vallen >= cap)
            r = ust_errf(e, "bad job id from the store");
        else
            memcpy(job_id, m.val, m.vallen), job_id[m.vallen] = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

int store_client_put(store_client *c, int rank, const char *key, const void *val, size_t len,
                     double timeout_s, ust_err *e) {
    store_msg m;
    char t[1100];
    pthread_mutex_lock(&c->mu);
    int r = request(c, ST_PUT, (uint32_t)rank, 0, key, val, (uint32_t)len, boot_now() + timeout_s,
                    &m, e);
    if (r == 0 && m.op != ST_OK)
        r = ust_errf(e, "bootstrap put of key '%s' failed: %s", key, rep_text(&m, t, sizeof t));
    pthread_mutex_unlock(&c->mu);
    return r;
}

int store_client_get(store_client *c, int rank, const char *key, void *val, size_t cap,
                     double timeout_s, ust_err *e) {
    store_msg m;
    char t[1600];
    pthread_mutex_lock(&c->mu);
    int r = request(c, ST_GET, (uint32_t)rank, wait_ms(timeout_s), key, NULL, 0,
                    boot_now() + timeout_s + 5.0, &m, e);
    if (r == 0 && m.op == ST_VAL) {
        if (m.vallen > cap)
            r = ust_errf(e,
                         "bootstrap get of key '%s' from rank %d: value of %u bytes does not "
                         "fit a buffer of %zu",
                         key, rank, m.vallen, cap);
        else
            memcpy(val, m.val, m.vallen), r = (int)m.vallen;
    } else if (r == 0 && m.op == ST_TIMEOUT) {
        r = ust_errf(e, "bootstrap get of key '%s' from rank %d timed out after %.1f s: %s", key,
                     rank, timeout_s, rep_text(&m, t, sizeof t));
    } else if (r == 0) {
        r = ust_errf(e, "bootstrap get of key '%s' from rank %d failed: %s", key, rank,
                     rep_text(&m, t, sizeof t));
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

int store_client_fence(store_client *c, uint32_t gen, double timeout_s, ust_err *e) {
    store_msg m;
    char t[1600];
    pthread_mutex_lock(&c->mu);
    int r = request(c, ST_FENCE, gen, wait_ms(timeout_s), NULL, NULL, 0,
                    boot_now() + timeout_s + 5.0, &m, e);
    if (r == 0 && m.op == ST_TIMEOUT)
        r = ust_errf(e, "bootstrap fence %u timed out after %.1f s: %s", gen, timeout_s,
                     rep_text(&m, t, sizeof t));
    else if (r == 0 && m.op != ST_OK)
        r = ust_errf(e, "bootstrap fence %u failed: %s", gen, rep_text(&m, t, sizeof t));
    pthread_mutex_unlock(&c->mu);
    return r;
}

void store_client_close(store_client *c, int say_bye) {
    if (!c) return;
    if (say_bye) {
        store_msg m;
        request(c, ST_BYE, 0, 0, NULL, NULL, 0, boot_now() + 5.0, &m, NULL);
    }
    close(c->fd);
    pthread_mutex_destroy(&c->mu);
    free(c->in.p);
    free(c->out);
    free(c);
}
