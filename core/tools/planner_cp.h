/* planner_cp: the context-parallel ring's traffic as parallel/cp.c routes it, for the planner. A
 * key/value block travels the ring only as far as the last rank whose queries see a key of it
 * (under cp_layout contiguous no rank before its owner, under a window only the ranks it reaches),
 * and its gradients go home from there; the blocks' positions (cp_layout_positions) and each
 * layer's window decide, so the sends differ by rank. Pure; answers are cached (a search asks the
 * same few many times). */
#ifndef UST_PLANNER_CP_H
#define UST_PLANNER_CP_H

#include "config.h"

/* One ring's block-sends (a block-send: one block's k and v, or their gradients) per micro-batch,
 * summed over the attention layers (model.n_layer, then model.mtp.depth full-attention blocks). */
typedef struct {
    double group;   /* by all the ring's ranks together */
    double busiest; /* by the rank that sends the most (the ring waits for it) */
} planner_ring;

/* The ring of rn blocks, block g holding the tokens of cp ranks g*a .. g*a+a-1 (a: the Ulysses
 * degree under a2a+ring, else 1), as cp_comm ring runs it: forward, each block to its last rank;
 * backward, the block again with its gradients, then the gradients home from that rank; under
 * full recompute (train.recompute) the forward once more. */
void planner_ring_sends(const ust_config *c, int rn, int a, planner_ring *out);

#endif
