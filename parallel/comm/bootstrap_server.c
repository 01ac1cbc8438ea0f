/* The server of the bootstrap TCP key-value store: a thread of rank 0.
 *
 * One poll() loop over the listening socket and one connection per rank (rank 0 connects to
 * itself like everyone else). Requests are answered at once when they can be; a GET of a key
 * nobody has put yet, or a FENCE not every rank has reached, is parked on its connection and
 * answered when the state changes, when its wait expires (TIMEOUT, with the names of what is
 * missing) or when a rank it depends on leaves (ERR). So the clients never poll.
 * A rank that joins with a different WORLD_SIZE, a rank number out of range or a rank number
 * already taken poisons the job: every later request of every rank is answered with that error,
 * so the mistake is reported on all sides.
 * With a job secret, a client is only heard once its HELLO carried the secret: one without it
 * (or one that sends no HELLO within HELLO_WAIT_S) is logged on stderr and dropped, so a stranger
 * can neither read the values nor poison the job.
 * Connections that have not said HELLO yet are few and short-lived, so idle ones cannot crowd
 * the ranks out: at most MAX_ANON of them (MAX_ANON_PER_HOST from one address); a new one beyond
 * that evicts the oldest one that has sent nothing (a rank's HELLO follows its connect at once),
 * and a rank that is dropped before its HELLO was read connects again (env_init). */
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
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_impl.h"
#include "log.h"

typedef struct entry {
    struct entry *next;
    int rank;
    char *key;
    uint8_t *val;
    uint32_t len;
} entry;

#define NBUCKET 4096
#define HELLO_WAIT_S 3.0 /* an anonymous connection gets this long to say HELLO */
#define MAX_ANON 64      /* connections without HELLO yet */
#define MAX_ANON_PER_HOST 32
#define ACCEPT_BATCH 64 /* connections accepted per wake-up of the loop */
#define LOG_DROPS 10    /* dropped clients logged one by one; later ones are only counted */

typedef struct {
    int fd;
    int rank; /* -1 until HELLO */
    int said_bye;
    double t_accept;
    char peer[64]; /* address:port, for the log */
    char host[48]; /* address only, for the per-address limit */
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
    char secret[STORE_MAX_SECRET + 1]; /* "" = every client is accepted */
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
    int closing;   /* the thread is ending: parked requests get an error now */
    long ndropped; /* clients refused so far (logged: the first LOG_DROPS) */
    uint8_t *out;  /* reply scratch */
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
    if (n == 0 || store_send_all(c->fd, s->out, n, log_now_s() + 10.0) < 0) {
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

/* One line on stderr per refused client, the first LOG_DROPS of them: a flood of strangers must
 * not flood the log too (store_server_stop says how many there were in all). */
static void log_drop(store_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_drop(store_server *s, const char *fmt, ...) {
    if (++s->ndropped > LOG_DROPS) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ustrain: bootstrap store %s: dropping a client %s%s\n", s->where, line,
            s->ndropped == LOG_DROPS ? " (further ones are only counted)" : "");
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
    double now = log_now_s();
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

/* HELLO: the connection says which rank it is (with the job secret). A bad rank or world
 * size poisons the job: every rank hears why. Returns -1 when the connection must close. */
static int handle_hello(store_server *s, conn *c, const store_msg *m) {
    int rank = (int)m->a, world = (int)m->b;
    if (c->rank >= 0) return reply_text(s, c, ST_ERR, "HELLO sent twice"), -1;
    if (s->secret[0] && !store_secret_equal(s->secret, m->val, m->vallen)) {
        log_drop(s, "from %s (says rank %d): %s job secret", c->peer, rank,
                 m->vallen ? "wrong" : "no");
        return reply_text(s, c, ST_ERR,
                          "the job secret (UST_JOB_SECRET) is missing or differs from rank "
                          "0's: every rank must get the same UST_JOB_SECRET"),
               -1;
    }
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

/* Handles one request; returns -1 when the connection must be closed. */
static int handle(store_server *s, conn *c, const store_msg *m) {
    char msg[1536];
    if (c->parked) return -1; /* one request at a time: a second one is a protocol error */
    if (m->op == ST_HELLO) return handle_hello(s, c, m);
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
    c->pdeadline = log_now_s() + m->b / 1000.0;
    answer_parked(s);
    return 0;
}

static int count_present(store_server *s) {
    int n = 0;
    for (int i = 0; i < s->nconn; i++) n += s->conns[i].rank >= 0;
    return n;
}

/* Connections that never said HELLO hold a slot each: a stranger could fill them all. */
static void drop_silent(store_server *s, double now) {
    for (int i = s->nconn - 1; i >= 0; i--)
        if (s->conns[i].rank < 0 && now >= s->conns[i].t_accept + HELLO_WAIT_S) {
            log_drop(s, "from %s: no HELLO within %.0f s", s->conns[i].peer, HELLO_WAIT_S);
            conn_close(s, i);
        }
}

/* Makes room for one more anonymous connection from host: when there are MAX_ANON of them (or
 * MAX_ANON_PER_HOST from host), closes the oldest one of that set that has sent nothing; one
 * with bytes waiting is likely a rank whose HELLO we have not read yet, and goes last. */
static void evict_for(store_server *s, const char *host) {
    int nanon = 0, nhost = 0;
    for (int i = 0; i < s->nconn; i++)
        if (s->conns[i].rank < 0) nanon++, nhost += !strcmp(s->conns[i].host, host);
    int same = nhost >= MAX_ANON_PER_HOST;
    if (!same && nanon < MAX_ANON) return;
    int victim = -1, victim_quiet = 0;
    for (int i = 0; i < s->nconn; i++) {
        conn *c = &s->conns[i];
        if (c->rank >= 0 || (same && strcmp(c->host, host))) continue;
        int waiting = 0;
        int quiet = c->in.len == 0 && (ioctl(c->fd, FIONREAD, &waiting) != 0 || waiting == 0);
        if (victim < 0 || quiet > victim_quiet ||
            (quiet == victim_quiet && c->t_accept < s->conns[victim].t_accept))
            victim = i, victim_quiet = quiet;
    }
    if (victim < 0) return;
    log_drop(s, "from %s: %d connections have not said HELLO yet%s; closing its oldest",
             s->conns[victim].peer, same ? nhost : nanon, same ? " from this address" : "");
    conn_close(s, victim);
}

/* "address:port" of a connected socket's peer, and the address alone. */
static void peer_name(int fd, char *out, size_t cap, char *addr, size_t acap) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0)
        getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, cap, "%s:%s", host, port);
    snprintf(addr, acap, "%s", host);
}

/* Accepts what is waiting (at most ACCEPT_BATCH). Returns -1 when out of memory. */
static int accept_new(store_server *s) {
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return 0; /* EAGAIN: none left; anything else: that client is gone */
        char peer[64], host[48];
        peer_name(fd, peer, sizeof peer, host, sizeof host);
        evict_for(s, host);
        if (s->nconn == s->capconn) {
            int nc_cap = s->capconn ? 2 * s->capconn : 16;
            conn *nc = realloc(s->conns, (size_t)nc_cap * sizeof *nc);
            if (!nc) return close(fd), -1;
            s->conns = nc, s->capconn = nc_cap;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn *c = &s->conns[s->nconn++];
        *c = (conn){.fd = fd, .rank = -1, .t_accept = log_now_s()};
        memcpy(c->peer, peer, sizeof peer), memcpy(c->host, host, sizeof host);
    }
    return 0;
}

static void *server_main(void *arg) {
    store_server *s = arg;
    struct pollfd *pf = NULL;
    int cap_pf = 0;
    for (;;) {
        double now = log_now_s();
        if (s->stopping && (count_present(s) == 0 || now >= s->stop_deadline)) break;
        drop_silent(s, now);
        double next = s->stopping ? s->stop_deadline : now + 3600;
        for (int i = 0; i < s->nconn; i++) {
            if (s->conns[i].parked && s->conns[i].pdeadline < next) next = s->conns[i].pdeadline;
            if (s->conns[i].rank < 0 && s->conns[i].t_accept + HELLO_WAIT_S < next)
                next = s->conns[i].t_accept + HELLO_WAIT_S;
        }
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
                s->stop_deadline = log_now_s() + wait_s;
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
                    log_drop(s, "from %s: %s", c->peer, why);
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
        if ((pf[1].revents & POLLIN) && accept_new(s) < 0) break;
        answer_parked(s); /* expired waits */
    }
    s->closing = 1;
    answer_parked(s);
    while (s->nconn) conn_close(s, s->nconn - 1);
    if (s->ndropped > LOG_DROPS)
        fprintf(stderr, "ustrain: bootstrap store %s: dropped %ld clients in all\n", s->where,
                s->ndropped);
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
    return store_server_start_auth(host, port, world, job_id, NULL, e);
}

store_server *store_server_start_auth(const char *host, int port, int world, const char *job_id,
                                      const char *secret, ust_err *e) {
    if (secret && strlen(secret) > STORE_MAX_SECRET)
        return ust_errf(e, "UST_JOB_SECRET has %zu bytes, more than the limit of %u",
                        strlen(secret), STORE_MAX_SECRET),
               NULL;
    store_server *s = calloc(1, sizeof *s);
    if (!s) return ust_errf(e, "out of memory"), NULL;
    snprintf(s->secret, sizeof s->secret, "%s", secret ? secret : "");
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
    s->lfd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
    snprintf(s->where, sizeof s->where, "%s:%d", host, s->port);
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

int store_server_port(const store_server *s) { return s->port; }

void store_server_stop(store_server *s, double wait_s) {
    if (!s) return;
    if (write(s->wake[1], &wait_s, sizeof wait_s) != (ssize_t)sizeof wait_s) {
        /* cannot happen with an open pipe; the thread would then only stop at process exit */
    }
    pthread_join(s->th, NULL);
    server_free(s);
}
