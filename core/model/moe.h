/* moe: a mixture-of-experts layer that stands in for a layer's MLP, forward/backward pairs on
 * the ops.h interface, llm.c style; expert parallelism through parallel/ep (no rank computed here).
 *   y(N,C) = sum_{j<k} gate_j * expert_{e_j}(x) [+ shared_expert(x)]   (the caller adds y to the
 *   residual stream; x is the normed input, kept by the caller for backward)
 * Router: x @ Wr^T (Wr [E,C]), softmax or sigmoid scores (model.moe.score), top-k of scores + bias
 * (group-limited: n_group/topk_group), gates renormalized (norm_topk) x routed_scale: ops.h
 * moe_router_fwd. Experts: llama SwiGLU or gpt2 GELU of width d_ff_expert; the optional shared
 * expert (width shared_d_ff) sees every token with weight 1. Losses, capacity, expert parallelism
 * and memory: where declared below. Per MoE layer: moe_init once, then moe_weights_init/
 * moe_enum_params/moe_acts_init per layer, moe_forward and moe_backward per micro-batch. */
#ifndef UST_MOE_H
#define UST_MOE_H

#include <stdint.h>

#include "config.h"
#include "cp.h" /* the groups the layer dispatches and reduces over: their contexts */
#include "ep.h"
#include "mem.h"
#include "ops.h"
#include "tp.h"

/* One expert's tensors (or their gradients). llama: gate, up, down; gpt2: up, up_b, down, down_b
 * (the others NULL). */
typedef struct {
    float *gate, *up, *up_b, *down, *down_b;
} moe_expert;

/* A MoE layer's tensors on this rank (or their gradients): experts[i] is global expert
 * first_expert + i. Filled through moe_enum_params' p/g targets. */
typedef struct {
    float *router; /* [E, C] */
    float *bias;   /* [E]: the balancing bias (cfg_moe_has_bias; else NULL) */
    moe_expert *experts;
    int nexperts, first_expert;
    moe_expert shared; /* all NULL without a shared expert */
} moe_weights;

/* One tensor of a MoE layer, for the model's parameter table. */
typedef struct {
    const char *name;   /* canonical checkpoint name, global expert index in it */
    int64_t rows, cols; /* whole tensor, [out, in]; biases are rows = 1 */
    int decay;          /* weight decay applies (matrices) */
    float init_std;     /* N(0, std); 0 means the constant init_value */
    float init_value;
    int expert;     /* global expert index; -1 for the router and the shared expert */
    float **p, **g; /* where the model stores the resolved parameter / gradient pointers */
} moe_param;
typedef void (*moe_param_fn)(void *ctx, const moe_param *p);

/* 1 when layer l (0-based) is a MoE layer (cfg_layer_is_moe): num_experts > 0, l >=
 * moe.first_dense (DeepSeek's first_k_dense_replace), and moe.layers[l] == 1 when that list is
 * given (Qwen3-MoE's mlp_only_layers / decoder_sparse_step), else l % moe.every == 0 (Megatron's
 * moe_layer_freq: every = 1 makes every layer MoE, every = 2 layers 0, 2, 4, ...). */
int moe_layer_is_moe(const ust_config *cfg, int l);
/* The router's options (ops.h) of model.moe: node-limited routing (max_nodes_per_token M) is the
 * group-limited choice of M groups, the nodes, ranked by their top_k / M highest scores. */
ops_moe_route moe_route_of(const ust_config *cfg);

/* Enumerates layer l's tensors held by ep rank ep_rank of ep_size, in a fixed order: router
 * (and its balancing bias), shared expert, then the local experts by increasing global index.
 * Names:
 *   model.layers.l.mlp.router.weight                          [E, C]
 *   model.layers.l.mlp.router.expert_bias                     [E] (cfg_moe_has_bias: not
 *       trained by the optimizer, its gradient stays 0; moved by moe_update_bias)
 *   model.layers.l.mlp.experts.e.{gate_proj,up_proj}.weight   [Fe, C]   (+ up_proj.bias [Fe], gpt2)
 *   model.layers.l.mlp.experts.e.down_proj.weight             [C, Fe]   (+ down_proj.bias [C],
 * gpt2) model.layers.l.mlp.shared_expert.{gate_proj,up_proj,down_proj}.weight (+ biases, gpt2)
 * Init: std 0.02, down_proj 0.02/sqrt(2*n_layer) (as the dense MLP), biases 0. w and g may be
 * NULL (then p and g are NULL: for counting, e.g. the memory plan); else they must have been set
 * up by moe_weights_init for this ep rank. Pure: needs no context. */
void moe_enum_params(const ust_config *cfg, int l, int ep_size, int ep_rank, moe_weights *w,
                     moe_weights *g, moe_param_fn fn, void *ctx);
/* moe_enum_params (w, g NULL) up to the first local expert: the other E/ep_size - 1 have its
 * shapes, so a table of sizes alone (the memory plan's, for thousands of layouts of models with
 * hundreds of experts a layer) counts them without listing each. Names are not formatted: ""
 * but the router's ".router." (the kind optim_matrix_kind reads from a name). */
void moe_enum_first_expert(const ust_config *cfg, int l, int ep_size, int ep_rank, moe_param_fn fn,
                           void *ctx);

/* Tokens a rank routes of the N of its micro-batch (N / parallel.tp). */
int64_t moe_rank_tokens(const ust_config *cfg, int64_t N);
/* Rows an expert-parallel context must move for MoE layers of N tokens per rank (before the tp
 * split) over ep ranks:
 * at most *send per dispatch, *recv held for the local experts (for ep_init). */
void moe_dispatch_rows(const ust_config *cfg, int64_t N, int ep, int64_t *send, int64_t *recv);

typedef struct {
    /* The tensor-parallel context (NULL: none). The tp ranks split the micro-batch's tokens: rank
     * r routes and computes rows [r*N/tp, (r+1)*N/tp) only (its sequence-parallel rows under sp),
     * dispatching them over its own ep group, so no expert work is repeated across tp. The
     * router, shared expert and local experts are replicated over tp and each rank saw other
     * tokens, so their gradients of every micro-batch are summed over tp (DESIGN section 3). */
    ust_tp *tp;
    ust_ep *ep; /* the expert-parallel context, ep_init'ed with moe_dispatch_rows' sizes (NULL:
                 * every expert on this rank; moe_init makes a group of one) */
    /* The cp context (NULL: none): the micro-batch's tokens are split over cp and tp, so the
     * aux-loss statistics are summed over cp, then tp. Capacity over the split
     * sequence (capacity_factor > 0): where every member's tokens sit, so drops are decided in
     * the micro-batch's token order as if one rank held it: member r's token j of sequence b is
     * at position cap_pos[r*cap_Tl + j] of cap_T. */
    ust_cp *cp;
    const int32_t *cap_pos;
    int cap_T, cap_Tl;
} moe_groups;

/* Load statistics and losses of one forward (over the stats groups' tokens).
 * Sequence-wise (DeepSeek-V3, model.moe.seq_aux_loss_coef): the same sum within each sequence
 * b of the micro-batch, seq = 1/B sum_b E sum_e f_{b,e} P_{b,e}, its statistics over the
 * sequence's tokens wherever they are (summed over the stats groups like the others).
 * Losses (Switch Transformer / ST-MoE), over the micro-batch's tokens T (summed over the
 * stats groups, e.g. the cp and sp shards, before use; docs/design.md section 4):
 *   aux = E * sum_e f_e P_e,  f_e = (assignments routed to e) / (T*k) (before capacity drops),
 *                             P_e = mean router probability of e over the tokens;
 *   z   = mean over tokens of logsumexp(logits)^2.
 * moe_forward returns both unscaled (aux_loss, z_loss) and their weighted sum
 * aux_loss_coef*aux + z_loss_coef*z (loss) for the caller to add to its loss; moe_backward adds
 * loss_scale * d(that sum) to the router, flowing through P_e (f_e is a count). */
typedef struct {
    double aux_loss, z_loss; /* unscaled */
    double seq_aux_loss;     /* unscaled; 0 without model.moe.seq_aux_loss_coef */
    double loss;     /* aux_loss_coef * aux_loss + z_loss_coef * z_loss + seq_aux_loss_coef * seq */
    double load_max; /* most assignments routed to one expert */
    double load_mean;    /* tokens * k / E */
    double dropped_frac; /* dropped assignments / (tokens * k) */
    int64_t tokens;
    const float *routed; /* host E: assignments routed to each expert (before drops), summed over
                          * the stats groups; valid until the next moe_forward */
} moe_stats;

/* The tensor-parallel split of the tokens (moe_groups.tp): this rank routes rows
 * [r*N, (r+1)*N) of the micro-batch's Nmb, and a layer's gradients of a micro-batch gather in
 * gbuf before their sum over the group. */
typedef struct {
    ust_tp *tp; /* NULL: none; n members, this one r */
    int n, r;
    float *gbuf; /* device gnumel: one layer's gradients under the tp split */
    int64_t gnumel;
    moe_weights gs;     /* views of gbuf */
    int fault_skip_sum; /* UST_FAULT_MOE_SKIP_TP_GRAD_SUM: keep the parts' gradients unsummed */
} moe_tp_split;

/* The routing decisions' host side: the capacity (its groups' choices gathered) and the host
 * copies of one forward's choices, rows and counts. */
typedef struct {
    double capacity_factor;
    ust_cp *cap_cp;       /* capacity decided over this group's tokens (NULL: local) */
    int32_t *cap_order;   /* host: every member's token (member*N + i) in sequence order */
    float *cap_topk;      /* device (n*N*k): every member's choices, gathered */
    float *cap_topk_host; /* host copy */
    int32_t *cap_count;   /* host E */
    float *tp_topk;       /* device (Nmb*k): the tp group's choices, gathered (capacity) */
    int32_t *tp_topk_host, *keep_host;           /* host Nmb*k each (capacity over the tp split) */
    int32_t *topk_host, *pos_host, *assign_host; /* host N*k each */
    int32_t *cnt_host;                           /* host 2E: routed, kept */
} moe_routing;

/* The aux, z and sequence-wise losses: coefficients, the cp group their statistics are summed
 * over (then tp's), and the device buffers of the statistics and the aux gradient factors. */
typedef struct {
    double aux_coef, z_coef;
    ust_cp *cp;            /* NULL: none */
    float *aux_dp, *stats; /* device E and stats_floats */
    /* The sequence-wise loss: B sequences of Tl rows in the micro-batch (Nmb = B*Tl rows on
     * this cp rank); this rank's rows meet nseg of them, segment s being rows [seg[3s],
     * seg[3s] + seg[3s+1]) of its N, of sequence seg[3s+2]. */
    double seq_coef;
    int seqB, seqTl, nseg;
    int32_t *seg;
    float *seq_dp; /* device B*E: each segment's aux gradient factors */
} moe_losses;

/* Aux-loss-free balancing: the step's loads and the bias update rate. */
typedef struct {
    float *loads, *loads_host; /* device, host n_layer*E (model_moe_end_step's staging) */
    int nlayers;
    double bias_rate;
    /* test fault UST_FAULT_MOE_LOCAL_LOADS: balance on this rank's counts, not the global ones */
    int fault_local_loads;
} moe_balance;

/* The layer's working buffers on the device (shared by the MoE layers, in turn). */
typedef struct {
    act *logits, *dlogits;       /* (N,E) (N,E) */
    float *dgate;                /* (N*k) */
    act *tmp;                    /* (N,C) */
    act *xd, *eout;              /* (N*k,C) (R,C), ep > 1 only */
    act *d_home, *d_local, *dxe; /* (N*k,C) (R,C) (R,C) */
    act *dh1, *dh2, *dact;       /* (R,Fe) each */
    const float **wp;            /* host 2*El: the grouped GEMMs' weight and bias pointer arrays */
} moe_scratch;

/* Context shared by the MoE layers of a model: dimensions, dispatch, and its parts above. */
typedef struct moe_ctx {
    const ust_ops *ops;
    ust_ep *ep, own_ep; /* the dispatch context (own_ep: a group of one) */
    int llama, shared, E, k, C, Fe, N;
    int Fs;              /* the shared expert's width (model.moe.shared_d_ff or Fe) */
    ops_moe_route route; /* the router's options (model.moe.score, norm_topk, groups, scale) */
    int Nmb;             /* tp.n * N: the micro-batch's tokens on this cp rank */
    int grouped;         /* model.moe.grouped_gemm: one grouped GEMM per projection */
    int El, e0;          /* local experts: [e0, e0 + El) */
    int64_t R;           /* rows of the local-expert buffers */
    int selective;       /* train.recompute selective: the experts' activation outputs (act,
                          * s_act) are not saved but recomputed in backward, in scratch.dh1 */
    /* host stats_floats: the statistics' host copy, free between forwards as host scratch (the
     * bias update, the backward's aux factors) */
    float *stats_host;
    moe_tp_split tp;
    moe_routing routing;
    moe_losses loss;
    moe_balance bal;
    moe_scratch scratch;
} moe_ctx;

/* One MoE layer's activations saved for backward. */
typedef struct {
    float *probs, *lse, *gate;    /* (N,E) (N) (N,k) */
    int32_t *topk, *assign, *pos; /* (N,k); assign: row -> assignment; pos: assignment -> row */
    act *xe, *h1, *h2, *act;      /* local-expert rows (R,C) (R,Fe) x3; h1 = gate_proj (llama) */
    act *eout;                    /* (N*k,C) expert outputs back home, in row order */
    act *s_h1, *s_h2, *s_act;     /* shared expert (N,Fs) each; act, s_act NULL: selective */
    ep_plan plan;
    int64_t nkept;      /* rows sent (kept assignments) */
    float *aux_dp_host; /* host E: d aux_coef*aux / d probs[:, e] */
    float zscale;       /* 2 z_coef / tokens */
} moe_acts;

/* N: tokens per micro-batch on this rank before the tensor-parallel split (B*T/cp; the layer
 * routes N/tp of them, see moe_groups.tp; N must divide by parallel.tp, which the config
 * checks). Needs model.moe.num_experts > 0 (validated config).
 * Expert parallelism: rank r of the ep group holds experts [r*E/ep, (r+1)*E/ep); tokens go to
 * them and back with ep_dispatch/ep_combine. Expert weight gradients are plain accumulations
 * over the tokens that reached the expert from every ep rank (under the tp split summed over tp
 * here); the caller reduces them over expert-dp x cp (and the router and shared expert over
 * dp x cp) like any other gradient.
 * Capacity: dropless when model.moe.capacity_factor == 0. Otherwise each expert keeps at most
 * ceil(capacity_factor * tokens * k / E) of the micro-batch's assignments (its tp parts and cp
 * shards together), in the micro-batch's token order (then choice order); a dropped assignment
 * contributes nothing (its gate is not renormalized away), so a token dropped by all its
 * experts gets y = 0 (+ shared expert) and only the caller's residual passes through. Drops are
 * decided before dispatch, per micro-batch, so ep does not move them.
 * The stats groups' members must call moe_forward together (one all-reduce of the statistics
 * per group), and so must the ep group's (moe_forward and moe_backward each run two
 * all-to-all(v)s plus one all-to-all of counts in forward) and, under the tp split, the tp
 * group's (the capacity's gather, the rows' all-gathers without sp, the gradient all-reduce). */
void moe_init(moe_ctx *m, const ust_config *cfg, const ust_ops *ops, ust_arena *arena, int N,
              const moe_groups *groups);
void moe_free(moe_ctx *m); /* host memory; the arena owns the rest */
void moe_weights_init(moe_weights *w, const moe_ctx *m);
void moe_weights_free(moe_weights *w);
/* One layer's saved activations from the arena (MEM_ACTS), sizes fixed by the config: the
 * local-expert buffers hold the worst case, R rows (moe_dispatch_rows: dropless N*k at ep = 1 and
 * ep*N*k at ep > 1, every rank's tokens all routed to this rank's experts; with a capacity at
 * most each source's capacity for each local expert). Under selective recompute the experts'
 * activation outputs are left out (recomputed from h1, h2 in backward). */
void moe_acts_init(moe_ctx *m, moe_acts *a, ust_arena *arena);
void moe_acts_free(moe_acts *a); /* host memory */
/* Bytes moe_init (with its ep_init) takes from the arena (for the memory plan). */
int64_t moe_ctx_bytes(const ust_config *cfg, int N, int ep_size);
/* Bytes moe_acts_init takes from the arena per layer (for the memory plan). */
int64_t moe_acts_bytes(const ust_config *cfg, int N, int ep_size);

/* y(N,C) = the layer's output for x(N,C); saves what backward needs in a; fills stats. */
void moe_forward(moe_ctx *m, moe_acts *a, const moe_weights *w, act *y, const act *x,
                 moe_stats *stats);
/* dx(N,C) = d/dx (overwritten, or += when acc_dx) given dy(N,C); ACCUMULATES into g the
 * gradients of this rank's tensors. loss_scale multiplies the aux and z-loss gradients (e.g. the
 * same 1/tokens or 1/micro-batches factor the caller applies to its own loss). x must be the
 * forward's input. */
void moe_backward(moe_ctx *m, moe_acts *a, const moe_weights *w, moe_weights *g, act *dx,
                  const act *dy, const act *x, float loss_scale, int acc_dx);
/* Aux-loss-free balancing over a step (DeepSeek-V3). The caller adds up each MoE layer's
 * moe_stats.routed over its micro-batches (one member of the stats groups counts each
 * micro-batch) into loads (host, n_layer*E, layer l at l*E) and sums them over the ranks whose
 * micro-batches differ (model_moe_end_step, through moe_balance's buffers): the step's global
 * counts, the same on every rank and in every layout. bias(E, device) += model.moe.bias_update_rate
 * * sign(mean load - load_e), from one layer's global step loads: identical on every rank that
 * holds the layer. moe_bias_delta: that increment alone (E floats, host), for a bias a sharding
 * layer holds (ZeRO-3). */
void moe_update_bias(moe_ctx *m, float *bias, const double *load);
void moe_bias_delta(const moe_ctx *m, const double *load, float *delta);

/* Under the tp split without sp: whole(Nmb, C) on every tp rank from each rank's rows
 * [tpr*N, (tpr+1)*N), in place (nothing at tp = 1). */
void moe_tp_gather_rows(moe_ctx *m, act *whole);

#endif
