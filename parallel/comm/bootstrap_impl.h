/* bootstrap internals: shared by bootstrap.c (detection, single process, environment parsing),
 * bootstrap_store.c (the TCP key-value store's wire format and client), bootstrap_server.c (its
 * server, a thread of rank 0), bootstrap_pmix.c and bootstrap_common.c (what bootstrap.c and the
 * PMIx path both use; bootstrap.c calls the PMIx path, never the other way round).
 * Only those files and test/test_bootstrap.c include this header.
 *
 * The store's wire format is stated at STORE_MAGIC. */
#ifndef UST_BOOTSTRAP_IMPL_H
#define UST_BOOTSTRAP_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bootstrap.h"

/* Store wire format, one frame per message, every integer little-endian:
 *   u32 len            bytes that follow (exactly STORE_HDR + keylen + vallen)
 *   u32 magic          STORE_MAGIC
 *   u8  op             store_op
 *   u8  flags          0
 *   u16 keylen         <= STORE_MAX_KEY, printable ASCII without spaces
 *   u32 a, b           op arguments (rank, world, fence generation, wait in ms)
 *   u32 vallen         <= STORE_MAX_VAL
 *   key, value
 * Every request gets exactly one reply; a frame that breaks any rule closes the connection. */
#define STORE_MAGIC 0x31545355u /* "UST1" */
#define STORE_HDR 20u
#define STORE_MAX_KEY 255u
#define STORE_MAX_VAL 65536u
#define BOOT_MAX_KEY 200 /* user keys; the store adds nothing, PMIx adds "ust." */

typedef enum {
    /* requests */
    ST_HELLO = 1, /* a = rank, b = world, value = job secret; reply OK with the job id */
    ST_PUT,       /* a = rank, key, value; reply OK */
    ST_GET,       /* a = owner rank, b = wait ms, key; reply VAL, or TIMEOUT/ERR after waiting */
    ST_FENCE,     /* a = generation, b = wait ms; reply OK when every rank arrived */
    ST_BYE,       /* clean goodbye; reply OK */
    /* replies */
    ST_OK = 16,
    ST_VAL,
    ST_TIMEOUT, /* value: what is missing, as text */
    ST_ERR,     /* value: the message, as text */
} store_op;

typedef struct {
    uint8_t op;
    uint32_t a, b;
    char key[STORE_MAX_KEY + 1];
    const uint8_t *val; /* points into the parsed buffer */
    uint32_t vallen;
} store_msg;

/* Parses one frame from buf[0..n). Returns 1 and sets *used when a whole valid frame is there,
 * 0 when more bytes are needed, -1 with a reason in why when the bytes can never be valid. */
int store_msg_parse(const uint8_t *buf, size_t n, store_msg *m, size_t *used, char *why,
                    size_t whylen);
/* Encodes a frame into out (capacity cap); returns its size, or 0 when it does not fit or breaks
 * a limit. */
size_t store_msg_encode(uint8_t *out, size_t cap, uint8_t op, uint32_t a, uint32_t b,
                        const char *key, const void *val, uint32_t vallen);
int store_key_valid(const char *key);

/* Strict integer parsing of an environment variable: returns 1 and sets *v when the variable is
 * set, 0 when it is unset or empty, -1 with a message naming the variable when it is not an
 * integer in [lo, hi]. */
int boot_env_int(const char *name, long lo, long hi, long *v, ust_err *e);

/* The rank-0 server and the client connection of the torchrun-style path. */
typedef struct store_server store_server;
typedef struct store_client store_client;

/* Binds host:port (only that address) and starts the serving thread. */
store_server *store_server_start(const char *host, int port, int world, const char *job_id,
                                 ust_err *e);
/* The job secret (UST_JOB_SECRET): a server started with one answers only clients whose HELLO
 * carries it as its value (compared in constant time); any other client is logged on stderr and
 * dropped before it can touch the job. NULL or "" accepts every client (store_server_start). */
#define STORE_MAX_SECRET 256u
store_server *store_server_start_auth(const char *host, int port, int world, const char *job_id,
                                      const char *secret, ust_err *e);
/* 1 when val[0..len) equals the secret; the time taken does not depend on where they differ. */
int store_secret_equal(const char *secret, const uint8_t *val, uint32_t len);
/* The port it listens on (useful when started with port 0). */
int store_server_port(const store_server *s);
/* Asks the server to stop once every rank that joined has left, or after wait_s, and joins it. */
void store_server_stop(store_server *s, double wait_s);

store_client *store_client_connect(const char *host, int port, double deadline, ust_err *e);
int store_client_hello(store_client *c, int rank, int world, char *job_id, size_t cap,
                       double deadline, ust_err *e);
/* store_client_hello presenting the job secret (NULL: none). */
int store_client_hello_auth(store_client *c, int rank, int world, const char *secret, char *job_id,
                            size_t cap, double deadline, ust_err *e);
int store_client_put(store_client *c, int rank, const char *key, const void *val, size_t len,
                     double timeout_s, ust_err *e);
int store_client_get(store_client *c, int rank, const char *key, void *val, size_t cap,
                     double timeout_s, ust_err *e);
int store_client_fence(store_client *c, uint32_t gen, double timeout_s, ust_err *e);
void store_client_close(store_client *c, int say_bye);
/* 1 once a request failed because the store closed or reset the connection. */
int store_client_lost(const store_client *c);

/* Values of the single-process path (and of the env path with WORLD_SIZE=1 and no store). */
typedef struct local_kv {
    struct local_kv *next;
    char *key;
    void *val;
    size_t len;
} local_kv;

struct boot_pmix; /* bootstrap_pmix.c */

struct boot_impl {
    local_kv *kv;
    store_server *server; /* rank 0 of the env path */
    store_client *client; /* every rank of the env path with a store */
    uint32_t fence_gen;
    char where[300]; /* MASTER_ADDR:MASTER_PORT */
    struct boot_pmix *pmix;
};

/* "<prefix>-<16 random hex digits>" (bootstrap_common.c). */
void boot_random_id(char *out, size_t cap, const char *prefix);

/* Socket helpers shared by the store's client and server. A growable receive buffer: */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} rbuf;
/* Reads what is available; returns bytes read, 0 on orderly close, -1 on error (EAGAIN: none). */
ssize_t rbuf_fill(rbuf *r, int fd);
void rbuf_consume(rbuf *r, size_t n);
/* Sends all of buf before the deadline; -1 with errno on failure. */
int store_send_all(int fd, const uint8_t *buf, size_t n, double deadline);

/* PMIx path. boot_pmix_available() is cheap: it only looks at the environment. */
int boot_pmix_available(void);
/* Returns 0 joined, 1 "no PMIx server here" (caller falls through), -1 error. */
int boot_pmix_init(ust_boot *b, ust_err *e);
int boot_pmix_put(ust_boot *b, const char *key, const void *val, size_t len, ust_err *e);
int boot_pmix_fence(ust_boot *b, ust_err *e);
int boot_pmix_get(ust_boot *b, int rank, const char *key, void *val, size_t cap, ust_err *e);
void boot_pmix_finalize(ust_boot *b);

#endif
