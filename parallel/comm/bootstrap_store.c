/* The TCP key-value store of the torchrun-style launch path: its wire format (described in
 * bootstrap_impl.h) and the client every rank uses. The server, a thread of rank 0, is in
 * bootstrap_server.c. Each client request is answered by exactly one reply, which the client
 * waits for sleeping in poll() on its socket: a GET of a key not yet put, or a FENCE not every
 * rank has reached, is held by the server until it can be answered, or until its wait expires
 * (then the reply names what is missing). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_impl.h"
#include "log.h"

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
    /* Every one of the kl bytes: a NUL inside would make the key a shorter one (found by
     * test/fuzz/fuzz_store, regression input corpus/store/crash-key-with-nul). */
    for (uint32_t i = 0; i < kl; i++)
        if (p[20 + i] <= ' ' || p[20 + i] > '~')
            return snprintf(why, whylen, "key has a byte outside printable ASCII"), -1;
    memcpy(m->key, p + 20, kl);
    m->key[kl] = 0;
    m->val = p + 20 + kl;
    m->vallen = vl;
    *used = 4 + (size_t)len;
    return 1;
}

/* Sends all of buf before the deadline (the peer may be slow to read a 64 KiB value). */
int store_send_all(int fd, const uint8_t *buf, size_t n, double deadline) {
    size_t off = 0;
    while (off < n) {
        ssize_t k = send(fd, buf + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            double left = deadline - log_now_s();
            if (left <= 0) return errno = ETIMEDOUT, -1;
            struct pollfd pf = {fd, POLLOUT, 0};
            poll(&pf, 1, (int)(left * 1000) + 1);
            continue;
        }
        return -1;
    }
    return 0;
}

/* Reads what is available; returns bytes read, 0 on orderly close, -1 on error (EAGAIN: none). */
ssize_t rbuf_fill(rbuf *r, int fd) {
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

void rbuf_consume(rbuf *r, size_t n) {
    if (n == 0) return;
    memmove(r->p, r->p + n, r->len - n);
    r->len -= n;
}

/* ---------------------------------------------------------------- client */

struct store_client {
    int fd;
    char where[300];
    rbuf in;
    size_t last_reply; /* bytes of the previous reply still in `in` (its value was handed out) */
    uint8_t *out;
    int lost; /* the store closed or reset the connection */
    pthread_mutex_t mu;
};

static const char *op_name(uint8_t op) {
    static const char *names[] = {"?", "HELLO", "PUT", "GET", "FENCE", "BYE"};
    return op <= ST_BYE ? names[op] : "?";
}

/* The connection is gone: says what happened, naming the store and the request. A store that
 * closes before answering HELLO has usually dropped us (too many strangers connected, or no
 * HELLO in time: rank 0's log says which); later, it means rank 0 ended. */
static int lost_connection(store_client *c, uint8_t op, int err, ust_err *e) {
    c->lost = 1;
    return ust_errf(e, "the key-value store at %s (served by rank 0) %s during a %s request%s",
                    c->where,
                    err ? (err == ECONNRESET ? "reset the connection" : strerror(err))
                        : "closed the connection",
                    op_name(op),
                    op == ST_HELLO ? " (it dropped this client before hearing it; see rank 0's "
                                     "log)"
                                   : " (rank 0 ended or dropped this client; see its message)");
}

int store_client_lost(const store_client *c) { return c->lost; }

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
    double backoff = 0.02, t0 = log_now_s();
    int last = 0, fd = -1;
    for (;;) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            break;
        }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r < 0 && errno == EINPROGRESS) {
            double left = deadline - log_now_s();
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
        if (log_now_s() + backoff > deadline) break;
        sleep_s(backoff); /* rank 0 may simply not be listening yet */
        if (backoff < 0.5) backoff *= 2;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return ust_errf(e,
                        "could not connect to the key-value store of rank 0 at %s:%d "
                        "(MASTER_ADDR:MASTER_PORT) within %.1f s: %s; is rank 0 running, and do "
                        "all ranks have the same MASTER_ADDR and MASTER_PORT?",
                        host, port, log_now_s() - t0, strerror(last ? last : ETIMEDOUT)),
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
    if (store_send_all(c->fd, c->out, n, log_now_s() + 30.0) < 0)
        return lost_connection(c, op, errno, e);
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
        double left = wait_deadline - log_now_s();
        if (left <= 0)
            return ust_errf(e, "the key-value store at %s did not answer in time", c->where);
        struct pollfd pf = {c->fd, POLLIN, 0};
        int k = poll(&pf, 1, (int)(left * 1000) + 1);
        if (k < 0 && errno != EINTR) return ust_errf(e, "poll: %s", strerror(errno));
        if (k <= 0) continue;
        ssize_t got = rbuf_fill(&c->in, c->fd);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return lost_connection(c, op, got < 0 ? errno : 0, e);
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

int store_secret_equal(const char *secret, const uint8_t *val, uint32_t len) {
    size_t n = strlen(secret);
    /* Every byte of the secret is looked at whatever the input: only its length can leak. */
    unsigned diff = (size_t)len != n;
    for (size_t i = 0; i < n; i++) diff |= (uint8_t)secret[i] ^ (i < len ? val[i] : 0u);
    return diff == 0;
}

int store_client_hello(store_client *c, int rank, int world, char *job_id, size_t cap,
                       double deadline, ust_err *e) {
    return store_client_hello_auth(c, rank, world, NULL, job_id, cap, deadline, e);
}

int store_client_hello_auth(store_client *c, int rank, int world, const char *secret, char *job_id,
                            size_t cap, double deadline, ust_err *e) {
    store_msg m;
    char t[1100];
    uint32_t sl = secret ? (uint32_t)strlen(secret) : 0;
    pthread_mutex_lock(&c->mu);
    int r =
        request(c, ST_HELLO, (uint32_t)rank, (uint32_t)world, NULL, secret, sl, deadline, &m, e);
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
    int r = request(c, ST_PUT, (uint32_t)rank, 0, key, val, (uint32_t)len, log_now_s() + timeout_s,
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
                    log_now_s() + timeout_s + 5.0, &m, e);
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
                    log_now_s() + timeout_s + 5.0, &m, e);
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
        request(c, ST_BYE, 0, 0, NULL, NULL, 0, log_now_s() + 5.0, &m, NULL);
    }
    close(c->fd);
    pthread_mutex_destroy(&c->mu);
    free(c->in.p);
    free(c->out);
    free(c);
}
