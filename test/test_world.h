/* test_world: for test programs that scripts/ustrun starts on several ranks. test_world_join
 * joins the job (bootstrap) and makes one shared-memory communicator over every rank;
 * test_world_leave waits for everyone at a barrier and tears it down. */
#ifndef UST_TEST_WORLD_H
#define UST_TEST_WORLD_H

#include <stdio.h>
#include <stdlib.h>

#include "bootstrap.h"
#include "comm.h"

typedef struct {
    ust_boot boot;
    comm_ctx *ctx;
    ust_comm *comm;
} test_world;

/* 0 on success; prints a FAIL line and returns 1 otherwise. */
static inline int test_world_join(test_world *w, const char *name) {
    ust_err e;
    if (boot_init(&w->boot, 30, &e)) return printf("FAIL boot: %s\n", e.msg), 1;
    comm_opts co = {.backend = COMM_BACKEND_SHM, .timeout_s = 30};
    int *ranks = malloc(w->boot.world * sizeof(int));
    for (int i = 0; i < w->boot.world; i++) ranks[i] = i;
    comm_group_spec spec = {name, ranks, w->boot.world};
    int rc = comm_ctx_init(&w->ctx, &w->boot, &co, &e) ||
             comm_create_many(w->ctx, 1, &spec, &w->comm, &e);
    free(ranks);
    if (rc) return printf("FAIL comm: %s\n", e.msg), 1;
    return 0;
}

static inline void test_world_leave(test_world *w) {
    comm_req bar = comm_barrier(w->comm);
    comm_wait(&bar);
    comm_ctx_free(w->ctx);
    boot_finalize(&w->boot);
}

#endif
