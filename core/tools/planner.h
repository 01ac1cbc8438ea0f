/* planner: the layout search behind `ustrain plan` (the Ultra-Scale Playbook's three steps: fit
 * one model instance in memory, reach the global batch, maximize throughput). It enumerates every
 * layout (dp, tp, pp, vpp, pipeline schedule, cp, ep, sp, ZeRO stage, micro-batch, recompute) of a
 * world size that
 * cfg_validate accepts, keeps those whose memory plan (plan_memory, the number `validate` prints)
 * fits the GPU, and ranks them by a step time estimated from closed-form costs: compute at a
 * given MFU, ring-collective times of every group over intra- or inter-node bandwidth, and the
 * pipeline bubble. Pure: no communicator, no allocation beyond the result list. */
#ifndef UST_PLANNER_H
#define UST_PLANNER_H

#include <stdbool.h>

#include "config.h"

/* The machine the layout is planned for. */
typedef struct {
    double peak_flops; /* per GPU, FLOP/s (default 989e12: H100/H200 dense bf16) */
    double mfu;        /* fraction of the peak the compute reaches (default 0.4) */
    double bw_intra;   /* bytes/s per GPU per direction inside a node (default 450e9, NVLink) */
    double bw_inter;   /* bytes/s per GPU across nodes (default 50e9, 400 Gb/s InfiniBand) */
    int gpus_per_node; /* default 8 */
    double gpu_mem;    /* bytes per GPU (default 80 GiB) */
} planner_hw;

void planner_hw_defaults(planner_hw *h);

/* One candidate layout; planner_apply writes it into a config. schedule is parallel.pp_schedule
 * (1f1b at pp 1, where a single stage makes it irrelevant). */
typedef struct {
    int dp, tp, pp, vpp, cp, ep, zero, micro_batch;
    bool sp;
    ust_recompute recompute;
    ust_pp_schedule schedule;
} planner_layout;

/* out = base with the layout's parallel.* (pp_schedule included; pp_layers an even split, or
 * as even as it gets when the stages do not divide the layers: the first and last stage fewer),
 * train.micro_batch_size, train.recompute and optimizer.zero_stage. */
void planner_apply(const ust_config *base, const planner_layout *l, ust_config *out);

/* Parameter counts of the whole model (no padding but the vocabulary's), by kind. */
typedef struct {
    double emb;       /* token embedding (+ gpt2's positions) */
    double head;      /* final norm + lm_head (no lm_head when tied) */
    double attn;      /* one layer: attention + both norms (split over tp) */
    double mlp;       /* one dense MLP (split over tp) */
    double moe_dense; /* one MoE layer's router + shared expert (whole on every tp rank) */
    double expert;    /* one expert of a MoE layer (whole; sharded over ep) */
    int n_moe;        /* MoE layers */
    double n_params;  /* total */
    /* weights in a matmul per token, i.e. forward FLOPs / 2 (MoE: top_k experts only) */
    double mm_dense; /* attention, dense MLPs, lm_head, model.mtp's: split over tp */
    double mm_moe;   /* routers, active experts, shared experts: computed on every tp rank */
    double mtp;      /* model.mtp's modules (on the head's stage) */
    double mm_mtp;   /* theirs, with their logits through the shared head (part of mm_dense) */
} planner_sizes;

void planner_model_sizes(const ust_config *c, planner_sizes *s);

/* Training FLOPs per token at the config's seq_len: 6 x the matmul weights (mm_dense + mm_moe)
 * + every attention layer's model_attention_flops: what a run's model_flops_per_token counts
 * (its MFU's). */
double planner_flops_per_token(const ust_config *c);

/* Ring collective times over n ranks at bw bytes/s. bytes: the whole buffer (all-reduce, the
 * gathered result of an all-gather, the input of a reduce-scatter, one rank's send buffer of an
 * all-to-all). n == 1 costs 0. */
double planner_allreduce_s(double bytes, int n, double bw);     /* 2(n-1)/n * bytes / bw */
double planner_allgather_s(double bytes, int n, double bw);     /* (n-1)/n * bytes / bw */
double planner_reducescatter_s(double bytes, int n, double bw); /* (n-1)/n * bytes / bw */
double planner_alltoall_s(double bytes, int n, double bw);      /* (n-1)/n * bytes / bw */

/* 1 when a group whose members are `stride` ranks apart (size members) lies inside one node:
 * it spans stride*size consecutive ranks, which must fit in and divide gpus_per_node. */
int planner_intra_node(int stride, int size, int gpus_per_node);

enum { PLAN_DP, PLAN_TP, PLAN_CP, PLAN_PP, PLAN_EP, PLAN_NGROUPS };
extern const char *const planner_group_names[PLAN_NGROUPS];

/* The estimate of one layout (a config that passed cfg_validate). Seconds per step. */
typedef struct {
    double compute; /* this rank's FLOPs / (mfu * peak) */
    double bubble;  /* the schedule's analytic bubble fraction * compute */
    double comm;    /* sum of group[] (no overlap with compute assumed) */
    double group[PLAN_NGROUPS];
    int intra[PLAN_NGROUPS];   /* the group's bandwidth: 1 intra-node, 0 inter-node */
    double sent[PLAN_NGROUPS]; /* bytes this rank sends over the group per step: group x bw */
    double cp_group;           /* bytes the cp group's ranks send together per step (the
                                  metric comm_bytes_cp_group; a mean pipeline stage's) */
    double ep_inter;           /* of sent[PLAN_EP], the token rows to ep members on other nodes
                                  (the metric comm_bytes_ep_internode): copies spread evenly
                                  over the members, (ep - q) / (ep - 1) of them with q a node */
    double total;              /* compute + bubble + comm */
    double tokens_per_s;       /* global batch tokens / total */
    double mem;                /* plan_memory total bytes (fp32, as `validate`: pipeline rank 0) */
    double mem_peak;           /* the largest over the pipeline ranks: what must fit */
} planner_cost;

void planner_estimate(const ust_config *c, const planner_hw *hw, planner_cost *out);

typedef struct {
    planner_layout l;
    planner_cost cost;
} planner_entry;

typedef struct {
    long candidates;        /* layouts enumerated */
    long invalid;           /* refused by cfg_validate */
    long over_mem;          /* valid but over hw->gpu_mem */
    long fitting;           /* valid and fitting: the entries */
    planner_entry smallest; /* valid layout with the least memory (fitting or not) */
    char first_error[512];  /* cfg_validate's message for the first refused layout */
} planner_stats;

/* Orders by step time, then larger micro-batch, then less memory, then the layout itself
 * (schedule included): a strict weak order that never leaves two distinct layouts tied. */
int planner_compare(const void *a, const void *b);

/* Every fitting layout of `world` ranks for base's model, seq_len and global batch, sorted by
 * planner_compare; *out is malloc'd (free it). Returns the count (0: none fits). */
long planner_search(const ust_config *base, int world, const planner_hw *hw, planner_entry **out,
                    planner_stats *st);

/* Keeps the first (best) entry of each mesh (dp, tp, pp, vpp, cp, ep) in order, whatever its
 * schedule; returns the new count. */
long planner_best_per_mesh(planner_entry *e, long n);

#endif
