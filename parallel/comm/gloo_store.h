/* gloo_store: the C face of the only C++ in parallel/ (gloo_store.cc), which comm_gloo.c uses.
 * It implements gloo's rendezvous Store over ustrain's bootstrap key-value store (so gloo meets
 * its peers through the same store, with the same job secret, under ustrun, mpirun and srun),
 * makes one TCP device per process bound to a chosen address, connects a group's full mesh and
 * runs the collectives. Every call catches gloo's exceptions: it returns -1 with gloo's message
 * in err (a dead peer, a timeout), never throws. Buffers are host memory; timeouts in seconds.
 * Built and linked only with -DUST_GLOO (Makefile: gloo/context.h found). */
#ifndef UST_GLOO_STORE_H
#define UST_GLOO_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ugloo_dev ugloo_dev;
typedef struct ugloo ugloo;

/* The TCP device: listens on the address of hostname (a name or numeric address) or, when iface
 * is not NULL, of that network interface. */
ugloo_dev *ugloo_dev_create(const char *hostname, const char *iface, char *err, size_t cap);
void ugloo_dev_free(ugloo_dev *d);

/* Connects the full mesh of a group: member `rank` of `size`, whose members are the global ranks
 * granks[]. Every gloo key goes to the bootstrap store as "<prefix>.<gloo key>", published under
 * this rank; gloo's "<i>" (or "rank_<i>") keys are read from member i's global rank. Collective
 * over the group's members. */
ugloo *ugloo_connect(ugloo_dev *d, ust_boot *b, const char *prefix, const int *granks, int rank,
                     int size, double timeout_s, char *err, size_t cap);
void ugloo_free(ugloo *g);

/* In place: buf (n floats) = sum over members. */
int ugloo_allreduce_f32(ugloo *g, float *buf, size_t n, char *err, size_t cap);
/* buf (size*n floats, every member's contribution) -> out (n floats) = the sum of chunk rank
 * (ring: size-1 steps, each sending one chunk to the next member). buf is overwritten. */
int ugloo_reduce_scatter_f32(ugloo *g, float *buf, float *out, size_t n, char *err, size_t cap);
/* out[i*bytes ..] = member i's block; this member's block must already be in place. */
int ugloo_allgather(ugloo *g, void *out, size_t bytes, char *err, size_t cap);
int ugloo_broadcast(ugloo *g, void *buf, size_t bytes, int root, char *err, size_t cap);
int ugloo_barrier(ugloo *g, char *err, size_t cap);

/* One transfer of a batch: bytes to or from member peer (never this member). */
typedef struct {
    int peer;
    int is_send;
    void *buf;
    size_t bytes;
} ugloo_xfer;
/* Posts every transfer, then waits for all of them; messages between a pair match in posting
 * order. slot separates independent streams (0: send/recv batches, 1: all-to-all). */
int ugloo_batch(ugloo *g, const ugloo_xfer *x, int n, int slot, char *err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
