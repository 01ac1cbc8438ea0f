/* cp: context parallelism. Every sequence of T tokens is split over the cp group of n ranks:
 * zigzag (default) cuts it into 2n chunks and gives rank r chunks r and 2n-1-r, so causal
 * attention costs the same on every rank; contiguous gives rank r chunk r of n. Positions and
 * targets follow the tokens. Attention runs as a ring: each rank keeps its queries while key/value
 * blocks travel around the group, partial results merged through their log-sum-exp; in backward
 * the key/value gradients travel with their blocks and arrive home. The allgather variant
 * gathers every block first instead. Everything else runs per token on the local tokens.
 * With n == 1 every call is the plain single-rank attention. */
#ifndef UST_CP_H
#define UST_CP_H

#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "mem.h"
#include "ops.h"

typedef struct ust_cp {
    const ust_ops *ops;
    ust_comm *comm;
    int n, rank, T, Tl, B, Hkv, D;
    ust_cp_layout layout;
    ust_cp_comm mode;
    int32_t *pos_host;    /* n x Tl: the positions every rank holds */
    int32_t *pos;         /* the same on the device */
    act *kv[2][4];        /* ring buffers: k, v, dk, dv of one block, twice */
    act *acc_dk, *acc_dv; /* this rank's own block's gradients on their way around */
    act *part_out;
    float *part_lse;
    act *all_k, *all_v, *all_dk, *all_dv; /* allgather mode: every block */
    comm_p2p p2p[8];                      /* the posted send/recv list of the block in flight */
    double pairs;        /* (query, key) pairs attended so far (causal ones only) */
    double *block_pairs; /* per block owner: causal pairs of our queries with its keys */
    int32_t *block_max;  /* per block owner: its largest position */
    int64_t skipped;     /* blocks no query could see under document masking, not computed */
} ust_cp;

/* A micro-batch's documents (ops.h q_start): where each local query's document begins, on the
 * device (B x Tl), and the smallest of them: a key/value block whose positions all come before
 * it is skipped (it still travels the ring). */
typedef struct {
    const int32_t *start;
    int32_t min_start;
} cp_docs;

/* comm may be NULL (no context parallelism). T: the whole sequence; B, H, Hkv, D: the attention
 * shapes of this rank (heads after tensor parallelism). */
void cp_init(ust_cp *cp, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int T, int B, int H,
             int Hkv, int D, ust_cp_layout layout, ust_cp_comm mode);
/* The device buffers cp_init carves (MEM_ACTS): the positions and, for n > 1, the K/V blocks
 * in flight and the partial outputs. cp_init's own allocation, which the memory plan runs
 * against a counting arena. */
void cp_alloc_buffers(ust_cp *cp, ust_arena *arena, int H);
/* Rank 0 of a group of n without communicator or buffers: what the memory plan shapes a model
 * with (cp_local_len answers as in the real group) and sizes the buffers of. */
ust_cp cp_shape(const ust_ops *ops, int n, int T, int B, int Hkv, int D, ust_cp_comm mode);
void cp_free(ust_cp *cp); /* host memory; the arena owns the rest */
int cp_local_len(const ust_cp *cp);
/* 1 on the group's first rank (the one that counts a value every member shares). */
int cp_is_first(const ust_cp *cp);
/* Positions of rank r's tokens in the sequence (host, Tl entries, increasing). */
const int32_t *cp_positions_of(const ust_cp *cp, int r);
const int32_t *cp_positions_device(const ust_cp *cp); /* this rank's, on the device */
/* Pure: the positions rank r of n holds under a layout (Tl = T/n entries into out). */
void cp_layout_positions(ust_cp_layout layout, int T, int n, int r, int32_t *out);

/* Causal attention of this rank's queries over the whole sequence: q(B,Tl,H,D), k,v(B,Tl,Hkv,D)
 * are the local tokens' projections; out(B,Tl,H,D), lse(B,H,Tl) as ops.h's attention_fwd;
 * docs (NULL: none) masks documents. */
void cp_attention_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                      int H, const cp_docs *docs);
/* Accumulates into dq, dk, dv (the caller zeroes them) the gradients of the local tokens. */
void cp_attention_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                      const float *lse, const act *q, const act *k, const act *v, int H,
                      const cp_docs *docs);

#endif
