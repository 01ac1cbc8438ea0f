/* cp: context parallelism. Every sequence of T tokens is split over the cp group of n ranks
 * (zigzag or contiguous: cp_layout_positions); positions and targets follow the tokens, and
 * everything but attention runs per token on the local tokens. Attention of the local queries over
 * the whole sequence runs as a ring of key/value blocks (or all-gathered first), as Ulysses
 * (an all-to-all to a head split and back), or as both (a2a+ring). With n == 1 every call is the
 * plain single-rank attention. docs/cp.md explains the layouts, the exchanges and their traffic. */
#ifndef UST_CP_H
#define UST_CP_H

#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "mem.h"
#include "ops.h"

/* The Ulysses stage over `a` ranks (1: none; DeepSpeed-Ulysses). Before attention an all-to-all
 * turns the sequence split into a head split: member j gets every token of query heads
 * [j H/a, (j+1) H/a) and of their key/value heads; with fewer key/value heads than ranks each is
 * replicated to the members whose query heads use it, Megatron's way, and their gradients summed
 * back. Attention then runs over the Tb = a * Tl gathered tokens (positions and document starts
 * gathered with them, in member order: the kernel masks by position, so nothing is reordered) and
 * an all-to-all brings the output back. Backward scatters q, k, v, out and d out again (nothing
 * head-split is kept between forward and backward) and brings dq, dk, dv back. */
typedef struct {
    ust_comm *comm; /* the whole group under a2a, the topology's cp_a2a group under a2a+ring */
    int a, Hq, Hk;  /* after the all-to-all this rank holds Hq query and Hk key/value heads */
    act *uq, *uk, *uv, *uo, *udq, *udk, *udv, *udo; /* head-split tensors (B, Tb, heads, D) */
    act *sbuf, *rbuf;                               /* all-to-all staging */
    int32_t *ustart_host;                           /* gathered document starts, for their min */
} cp_ulysses_stage;

/* Who needs which block under one mask (window W keys, 0: causal only), from the blocks'
 * positions alone, so every rank knows it without asking: need[r * rn + g] when a query of block
 * r sees a key of block g; hops[g] how far block g travels the ring (its last rank that needs it,
 * counted from g: the ranks after it neither see it nor pass it on). */
typedef struct {
    int window;
    uint8_t *need;
    int *hops;
} cp_route;
#define CP_MAX_ROUTES (CFG_MAX_WINDOWS + 1)

/* The ring over `rn` blocks of Tb tokens (this rank's block is number rr): each rank keeps its
 * queries while key/value blocks travel around, partial results merged through their
 * log-sum-exp, each block only as far as a rank needs it (cp_route); in backward the key/value
 * gradients travel with their blocks and go home from the last rank that needed them. The
 * allgather mode gathers every block first instead. */
typedef struct {
    ust_comm *comm;     /* the whole group under ring/allgather, cp_ring under a2a+ring, NULL (rn 1)
                         * under a2a */
    int rn, rr, Hkvr;   /* Hkvr: the key/value heads of a block (Ulysses' Hk) */
    int32_t *bpos_host; /* rn x Tb: each block's positions (host) */
    int32_t *bpos;      /* the same on the device */
    act *kv[2][4];      /* ring buffers: k, v, dk, dv of one block, twice */
    act *acc_dk, *acc_dv; /* this rank's own block's gradients on their way around */
    act *part_out;
    float *part_lse;
    act *all_k, *all_v, *all_dk, *all_dv; /* allgather mode: every block */
    comm_p2p p2p[8];                      /* the posted send/recv list of the block in flight */
    /* the latent ring (ust_cp.lat > 0): latent and its gradient of one block, twice; this
     * rank's packed latent and its gradient from the other ranks; allgather mode: every block's;
     * a remote block re-expanded: k, v, dk, dv (B, Tb, Hkvr, D) */
    act *lat[2][2], *lat_mine, *acc_dlat, *all_lat, *all_dlat, *ex[4];
    double *block_pairs;           /* per block owner: causal pairs of our queries with its keys */
    int32_t *block_max;            /* per block owner: its largest position */
    cp_route route[CP_MAX_ROUTES]; /* per mask met so far (made at its first use) */
    int nroute;
} cp_ring_stage;

typedef struct ust_cp {
    const ust_ops *ops;
    ust_comm *comm; /* the whole group (n ranks, this one `rank`) */
    int n, rank, T, Tl, B, H, Hkv, D;
    int lat; /* > 0: the latent ring's width per token (cp_latent_fwd); 0: K/V blocks travel */
    int Tb;  /* the tokens one attention call sees: a * Tl (the ring's block, Ulysses' gather) */
    ust_cp_layout layout;
    ust_cp_comm mode;
    /* n x Tl: the positions every rank holds, the group's geometry (the ring's block positions
     * and pair counts, MoE's capacity order); a micro-batch's own travel in its ust_batch */
    int32_t *pos_host;
    cp_ulysses_stage uly;
    cp_ring_stage ring;
    /* statistics, read by the trainer's metrics and the tests */
    double pairs;     /* (query, key) pairs attended so far (causal ones only) */
    double a2a_bytes; /* Ulysses: the bytes this rank's all-to-alls sent (cp_a2a_layer_bytes) */
    int64_t skipped;  /* blocks no query could see under document masking, not computed */
    float *logit_max; /* cp_track_logit_max's destination for the next forward (NULL: none) */
} ust_cp;

/* A micro-batch's documents (ops.h q_start): where each local query's document begins, on the
 * device (B x Tl; under Ulysses the gathered B x Tb of cp_gather_docs), and the smallest of them:
 * a key/value block whose positions all come before it is skipped (it still travels the ring).
 * window: the sliding window these starts include (model.sliding_window; 0: none): the ring
 * sends a block no further than the last rank whose queries' windows reach it. */
typedef struct {
    const int32_t *start;
    int32_t min_start;
    int window;
} cp_docs;

/* comm may be NULL (no context parallelism). T: the whole sequence; B, H, Hkv, D: the attention
 * shapes of this rank (heads after tensor parallelism). a2a, ring: under a2a+ring the
 * topology's cp_a2a and cp_ring sub-groups of comm (ignored otherwise; may be NULL). Heads that
 * the Ulysses degree does not divide are fatal (the config refused them first). lat > 0: the
 * blocks travel as a latent of lat values per token (cp_latent_fwd; ring and allgather only). */
void cp_init(ust_cp *cp, const ust_ops *ops, ust_comm *comm, ust_comm *a2a, ust_comm *ring,
             ust_arena *arena, int T, int B, int H, int Hkv, int D, int lat, ust_cp_layout layout,
             ust_cp_comm mode, int cp_a2a);
/* The device buffers cp_init carves (MEM_ACTS): the blocks' positions and, for n > 1, the K/V
 * blocks in flight and the partial outputs. cp_init's own allocation, which the memory plan runs
 * against a counting arena. */
void cp_alloc_buffers(ust_cp *cp, ust_arena *arena, int H);
/* Rank 0 of a group of n without communicator or buffers: what the memory plan shapes a model
 * with (cp_local_len answers as in the real group) and sizes the buffers of; a: the Ulysses
 * degree (config.h cfg_cp_a2a). */
ust_cp cp_shape(const ust_ops *ops, int n, int a, int T, int B, int Hkv, int D, int lat,
                ust_cp_comm mode);
/* The Ulysses degree (1: none): > 1 means the documents must be gathered (cp_gather_docs). */
int cp_ulysses(const ust_cp *cp);
/* Under Ulysses: the document starts of the tokens this rank attends, full(B, Tb) on the
 * device, from every a2a member's local(B, Tl); returns their smallest. */
int32_t cp_gather_docs(ust_cp *cp, int32_t *full, const int32_t *local);
/* The bytes one layer's attention sends over all-to-all (forward, backward) on one rank: the
 * formula the traffic test checks the counters against. es: bytes per activation element. */
double cp_a2a_layer_bytes(int a, int B, int Tl, int H, int Hkv, int D, int es, int backward);
void cp_free(ust_cp *cp); /* host memory; the arena owns the rest */
int cp_local_len(const ust_cp *cp);
/* 1 on the group's first rank (the one that counts a value every member shares). */
int cp_is_first(const ust_cp *cp);
/* Positions of rank r's tokens in the sequence (host, Tl entries, increasing). */
const int32_t *cp_positions_of(const ust_cp *cp, int r);
/* Pure: the positions rank r of n holds under a layout (Tl = T/n entries into out). */
void cp_layout_positions(ust_cp_layout layout, int T, int n, int r, int32_t *out);

/* Causal attention of this rank's queries over the whole sequence: q(B,Tl,H,D), k,v(B,Tl,Hkv,D)
 * are the local tokens' projections; out(B,Tl,H,D), lse(B,H,Tl) as ops.h's attention_fwd;
 * docs (NULL: none) masks documents; softcap (model.attn_softcap, 0: none) as attention_fwd's. */
void cp_attention_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                      int H, const cp_docs *docs, float softcap);
/* QK-clip's statistic: the next cp_attention_fwd max-accumulates each of its H query heads'
 * largest visible logit (the raw score, before any softcap) over this rank's queries into mx(H)
 * (device; NULL: none).
 * Under Ulysses this rank scores only its head share, the others' entries stay as they were. */
void cp_track_logit_max(ust_cp *cp, float *mx);
/* Accumulates into dq, dk, dv (the caller zeroes them) the gradients of the local tokens. */
void cp_attention_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                      const float *lse, const act *q, const act *k, const act *v, int H,
                      const cp_docs *docs, float softcap);

/* The latent ring (multi-head latent attention, docs/deepseek.md): a block travels as its
 * latent, lat values per token, and each rank re-expands a remote block into per-head k, v
 * itself (expand: k, v (B, Tl, Hkv, D) from lat (B, Tl, lat)); in backward it contracts the
 * remote block's dk, dv into the latent's gradient (contract: dlat += ..., and the expansion's
 * weight gradient its share), which travels home as the K/V gradients do. */
typedef struct {
    void *ctx;
    void (*expand)(void *ctx, act *k, act *v, const act *lat);
    void (*contract)(void *ctx, act *dlat, const act *dk, const act *dv, const act *lat);
} cp_expander;
/* The width per token (0: K/V blocks travel) and the buffer (B, Tl, lat) the caller packs this
 * rank's latent into before cp_latent_fwd / cp_latent_bwd. */
int cp_latent(const ust_cp *cp);
act *cp_latent_mine(ust_cp *cp);
/* cp_attention_fwd with the latent ring: k, v are the local block's expansion (used as they
 * are), the latent in cp_latent_mine travels. */
void cp_latent_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                   int H, const cp_docs *docs, const cp_expander *ex, float softcap);
/* cp_attention_bwd with the latent ring: dq, dk, dv accumulate the local block's gradients as
 * there; returns the gradient the other ranks' queries give this rank's latent (B, Tl, lat). */
const act *cp_latent_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                         const float *lse, const act *q, const act *k, const act *v, int H,
                         const cp_docs *docs, const cp_expander *ex, float softcap);

/* The group's size and this rank's place in it. */
int cp_size(const ust_cp *cp);
int cp_rank(const ust_cp *cp);
/* fp32 collectives over the whole group on the device, for what the sequence's shards share
 * beyond attention (the MoE layer's statistics and capacity): x(n) summed in place, and every
 * member's n floats gathered into all (member order; mine must be this rank's part of all).
 * At n == 1 nothing moves. */
void cp_allreduce(ust_cp *cp, float *x, int64_t n);
void cp_allgather(ust_cp *cp, const float *mine, float *all, int64_t n);

#endif
