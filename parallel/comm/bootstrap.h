/* bootstrap: who am I, how many are we, and a key-value exchange to meet the others.
 * Tried in order: PMIx (srun --mpi=pmix, mpirun), torchrun-style environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; a TCP key-value store served by rank 0),
 * single process. A singleton while a launcher says there are several tasks is an error.
 * Every wait is bounded by timeout_s; on expiry the call fails with a message naming the key. */
#ifndef UST_BOOTSTRAP_H
#define UST_BOOTSTRAP_H

#include <stddef.h>

#include "error.h"

typedef enum { BOOT_SINGLE, BOOT_ENV, BOOT_PMIX } boot_kind;

typedef struct boot_impl boot_impl;

typedef struct {
    boot_kind kind;
    int rank, world;
    int local_rank, local_world;
    int node_id, nnodes;
    int *node_of;    /* node of every rank (world entries) when nnodes > 1, else NULL (all 0) */
    char job_id[64]; /* unique per job, the same on every rank (names shm segments) */
    double timeout_s;
    boot_impl *impl;
} ust_boot;

/* Detects the launcher and joins the job. Returns -1 with a message on user-fixable problems
 * (bad environment, singleton under a multi-task launcher, refused connection, wrong world). */
int boot_init(ust_boot *b, double timeout_s, ust_err *e);
/* Publishes key=value (value up to 64 KiB) under this rank. */
int boot_put(ust_boot *b, const char *key, const void *val, size_t len, ust_err *e);
/* Collective: after it returns, every rank's puts before the fence are visible. */
int boot_fence(ust_boot *b, ust_err *e);
/* Gets the value `rank` put under key; waits (bounded) until present. Returns length or -1. */
int boot_get(ust_boot *b, int rank, const char *key, void *val, size_t cap, ust_err *e);
/* The node of `rank` (0..nnodes-1): from the "ust.node" value every rank of a multi-node job
 * publishes during boot_init. */
int boot_node_of(const ust_boot *b, int rank);
void boot_finalize(ust_boot *b);
const char *boot_kind_name(boot_kind k);

#endif
