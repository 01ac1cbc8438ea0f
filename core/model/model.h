/* model: the decoder-only transformer (gpt2 | llama) as a parameter table plus explicit
 * per-layer forward/backward on the ops.h interface, llm.c style.
 * Contract: model_create carves parameters, gradients and activations for one micro-batch
 * (B = train.micro_batch_size, T = train.seq_len, or this rank's T/cp tokens of each sequence
 * under context parallelism, positions given with each micro-batch: ust_batch) out of the arena;
 * model_forward runs the whole stack and, when dscale > 0, also leaves d(loss)/d(logits) * dscale
 * ready for model_backward, which ACCUMULATES parameter gradients (so gradient accumulation is just
 * calling it again). Parameters are stored unfused under canonical Hugging Face-style names
 * (docs/design.md section 7), each tensor [out_features, in_features] row-major, in one flat buffer
 * in table order. */
#ifndef UST_MODEL_H
#define UST_MODEL_H

#include <stdint.h>

#include "ckpt.h"
#include "config.h"
#include "mem.h"
#include "ops.h"

typedef struct {
    char name[CKPT_NAME_MAX];
    ckpt_tensor whole; /* global name and shape */
    ckpt_slice slice;  /* what this rank holds (the whole tensor on one rank) */
    int64_t numel;     /* elements held here */
    int64_t offset;    /* element offset into the flat parameter / gradient buffers */
    int decay;         /* weight decay applies (matrices) */
    int tp_split;      /* split over the tensor-parallel group (else every member holds it) */
    int matrix;        /* optim_matrix_kind: a hidden 2-D matrix, a MoE router, or neither */
    int replica;       /* a synced copy of a tensor another rank owns (tied embeddings over a
                          pipeline): loaded, never saved, counted once in the gradient norm */
    float init_std;    /* N(0, init_std); 0 means the constant init_value */
    float init_value;
    int repeat;     /* a sizes-only table (the memory plan's): this entry stands for `repeat` */
    int64_t stride; /* tensors of its shape, `stride` floats apart (a layer's local experts) */
} model_param;

typedef struct model model;

/* Units: the blocks a sharding layer gathers and reduces as a whole. Unit 0 holds the
 * embeddings, units 1..n_layer the layers, the last unit the final norm and lm_head (with
 * model_storage.vocab_chunk_rows the embeddings and the head are several units each). Each
 * unit is a contiguous range of the flat parameter buffer, padded to a multiple of unit_pad
 * floats so it splits evenly into shards. */
typedef enum {
    MODEL_FWD_BEGIN,
    MODEL_FWD_END,
    MODEL_BWD_BEGIN,
    MODEL_BWD_END,
    MODEL_BIN_BEGIN, /* zero-bubble B: the unit's input gradient only; reads its weights, writes */
    MODEL_BIN_END    /* no weight gradient (its BWD_BEGIN/END come later, around W) */
} model_phase;

/* Called at unit boundaries: FWD_BEGIN before a unit's forward, BWD_BEGIN before its backward
 * (and before a full-recompute rerun of its forward), *_END after. A unit's gradients are final
 * for this micro-batch at its BWD_END; with tied embeddings unit 0's gradients also receive the
 * head's contribution, so they are final only at unit 0's BWD_END. With vocabulary chunks
 * (model_storage.vocab_chunk_rows) a tied head brackets its use of each table chunk with that
 * chunk's own hooks instead: such a unit gets two FWD and two BWD pairs per micro-batch, and the
 * gradients written between each BWD pair are a contribution of their own (summed). */
typedef struct {
    void *ctx;
    void (*unit)(void *ctx, int unit, model_phase phase);
} model_hooks;

struct ust_tp;

#define MODEL_MAX_CHUNKS 16         /* parallel.vpp's limit */
#define MODEL_MAX_VOCAB_CHUNKS 4096 /* model_storage.vocab_chunk_rows: at most this many */

/* One pipeline stage a rank holds (a chunk): its global stage index, its layers [lo, hi),
 * whether it holds the embeddings (the first stage) or the final norm, head and loss (the last),
 * and how many micro-batches may be in flight through it (its activation sets). */
typedef struct {
    int stage, lo, hi, embed, head, slots;
    int copy; /* every tensor of the chunk is a replica (model_param.replica): dualpipe's mirror
                 ranks hold the stages of the first half again */
} model_stage;

struct ust_cp;
struct ust_ep;

typedef struct {
    struct ust_tp *tp; /* tensor parallelism (NULL: none) */
    struct ust_cp *cp; /* context parallelism over the group a sequence is split over (NULL:
                          none; the model makes a group of one) */
    int64_t unit_pad;  /* pad every unit to a multiple of this many floats (>= 16) */
    int alloc_params;  /* carve the whole flat parameter buffer from the arena */
    int alloc_grads;   /* the same for gradients */
    /* pipeline: the stages this rank holds, as the pipeline decides them (pp_stages); none:
     * the whole model, one activation set */
    int nchunks;
    model_stage chunks[MODEL_MAX_CHUNKS];
    int zb;            /* keep what deferred weight gradients need (zero-bubble schedules) */
    struct ust_ep *ep; /* expert parallelism: the dispatch context over the group holding the
                          other experts (NULL: none; MoE layers then make a group of one) */
    /* > 0: the vocabulary matrices (token table, lm_head or the tied copy) are split into units
     * of this many of this rank's rows each (the last may be shorter), the learned positions and
     * the final norm into units of their own, so a sharding layer never holds a whole table
     * (ZeRO-3). The embedding then runs chunk by chunk and the head computes its logits in
     * column blocks, one per chunk, with the softmax's log-sum-exp merged over the blocks. */
    int vocab_chunk_rows;
} model_storage;

int model_create(model **out, const ust_config *cfg, const ust_ops *ops, ust_arena *arena,
                 ust_err *e); /* whole parameters and gradients, unit_pad 16 */
int model_create_with(model **out, const ust_config *cfg, const ust_ops *ops, ust_arena *arena,
                      const model_storage *st, ust_err *e);
void model_set_hooks(model *m, const model_hooks *h);
/* logging.trace: each unit's forward, backward and input-only backward as a span on the
 * compute thread (named by its parameters, "fwd transformer.h.3"), while t is on; NULL: off. */
struct ust_trace;
void model_set_trace(model *m, struct ust_trace *t);

int model_num_units(const model *m);
void model_unit_range(const model *m, int unit, int64_t *offset, int64_t *len);
int model_param_unit(const model *m, int i);
/* Points unit u's parameters (or gradients) at base, a buffer laid out like the unit's range of
 * the flat buffer (base[0] is the unit's first float). */
void model_set_unit_params(model *m, int unit, float *base);
void model_set_unit_grads(model *m, int unit, float *base);
void model_destroy(model *m);

int model_num_params(const model *m);
model_param *model_param_at(model *m, int i);
int model_find_param(const model *m, const char *name); /* index or -1 */
float *model_params(model *m);                          /* flat device buffer */
float *model_grads(model *m);
int64_t model_numel(const model *m);
/* Training FLOPs per token (PaLM's convention): 6 x the matmul weights a token uses (top_k of a
 * MoE layer's experts; model.mtp's modules with their extra logits) + every attention layer's
 * model_attention_flops at the whole sequence; ustrain plan's planner_flops_per_token equals it. */
double model_flops_per_token(const model *m);
/* Layer l's scores q.k and weighted sum p.v (l >= n_layer: model.mtp's full-attention blocks) per
 * token: 2 FLOPs a multiply-add, x3 with backward, n_head x (q/k head + value head) per key, over
 * every key of the T-token sequence (Kaplan's and PaLM's count, not halved for the causal mask) or
 * of its sliding window when that is shorter (its first W-1 queries not discounted). */
double model_attention_flops(const ust_config *c, int l, int T);

/* Draws every parameter from the counter-based RNG keyed by (seed, name, element index). */
void model_init_params(model *m, uint64_t seed);
/* Host values of elements [flat0, flat1) of parameter i as the RNG draws them for the whole
 * tensor, so any shard initializes exactly its slice. */
void model_init_range(const model *m, int i, int64_t flat0, int64_t flat1, uint64_t seed,
                      float *host);
/* Receives this rank's part (its slice box, row-major) of one imported tensor, host memory. */
typedef void (*model_store_fn)(void *ctx, int param, const float *host);
/* Loads an llm.c GPT-2 checkpoint (gpt2_124M.bin layout) into a gpt2 model of matching shape;
 * each tensor goes to store (NULL: into the model's own flat parameter buffer). */
int model_load_llmc(model *m, const char *path, model_store_fn store, void *store_ctx, ust_err *e);

void model_zero_grads(model *m);
/* One micro-batch of this rank, made once by the data feeder and read by every chunk's forward
 * (host arrays of B x Tl, this rank's tokens: its context-parallel chunks of each sequence):
 * the input ids, their targets (< 0: not counted), each token's position in its sequence
 * (data.reset_positions: inside its document), and where its document begins (ops.h q_start;
 * data.doc_mask or reset_positions, else NULL). A chunk copies what it keeps to its slot. */
typedef struct {
    const int32_t *tokens, *targets, *positions, *doc_starts;
    /* model.mtp.depth D: (D,B,Tl) module k's input token at each position p, t_{p+k+1}, and its
     * target t_{p+k+2} (< 0: none, past the window or masked); NULL: the modules do not run
     * (a scorer's forward) */
    const int32_t *mtp_tokens, *mtp_targets;
} ust_batch;
/* The whole model on one micro-batch. Returns the sum of the per-token losses; *ntok gets the
 * number of counted targets. dscale > 0 prepares backward with d(loss_sum)/d(logits) scaled by
 * dscale (e.g. 1 / tokens in the global batch). */
double model_forward(model *m, const ust_batch *b, float dscale, int64_t *ntok);
void model_backward(model *m);

/* Pipeline stages. A rank holds model_num_chunks chunks (its stages), each with
 * model_chunk_slots activation sets: one per micro-batch in flight through it. The slot's
 * input tensor (Nl x C, model_boundary_numel activations) is where a stage's received activation
 * goes, its output what it sends; model_chunk_grad is the slot's gradient buffer: the output
 * gradient before backward (received, or written by the head), the input gradient after.
 * The first chunk of stage 0 reads the batch's tokens, the last stage's its targets. */
int model_num_chunks(const model *m);
int model_chunk_slots(const model *m, int chunk);
int64_t model_boundary_numel(const model *m);
act *model_chunk_input(model *m, int chunk, int slot);
act *model_chunk_output(model *m, int chunk, int slot);
act *model_chunk_grad(model *m, int chunk, int slot);
/* The slot keeps b's positions and document starts for its backward. */
double model_chunk_forward(model *m, int chunk, int slot, const ust_batch *b, float dscale,
                           int64_t *ntok);
/* input_only (zb's B, model made with storage.zb): input gradients only, keeping what
 * model_chunk_weight_grad (W) needs to add the weight gradients later. */
void model_chunk_backward(model *m, int chunk, int slot, int input_only);
void model_chunk_weight_grad(model *m, int chunk, int slot);
/* The per-token losses of the chunk's last forward (device, B x Tl of this rank; 0 where the
 * target is not counted) when the chunk holds the head, else NULL: what a multiple-choice
 * scorer sums per window. */
const float *model_chunk_losses(const model *m, int chunk);

/* Every tensor of the whole model (all stages, whole shapes) in checkpoint order. */
const ckpt_tensor *model_all_tensors(const model *m, int *n);
/* Their elements: the model's parameter count (padding rows included). */
int64_t model_all_numel(const model *m);
/* Tied embeddings whose embedding and head are both on this rank (one tensor serves both). */
int model_tied_local(const model *m);
/* The MoE losses (aux_loss_coef * aux + z_loss_coef * z, each micro-batch's averaged over the
 * step's micro-batches of the whole batch) of the training forwards since the last call; summed
 * over the dp x cp group and the pipeline it is the step's share of the loss. */
double model_take_moe_loss(model *m);
/* model.mtp: each module's summed per-token cross-entropy over the forwards since the last call
 * (this rank's tokens; sum over the dp x cp group), into loss[0..D); returns D. */
int model_take_mtp_losses(model *m, double *loss);
/* This rank's MoE layers and their last forward's load: most tokens routed to one expert, the
 * mean, the dropped fraction. Returns how many (at most max). */
int model_moe_stats(const model *m, int *layers, double *load_max, double *load_mean,
                    double *dropped, int max);
/* End of a training step for the MoE layers: this rank's routed counts of the step summed by
 * sum(ctx, x, n) (x: n floats on the device, summed in place over the ranks whose micro-batches
 * differ: dp x cp, and dualpipe's mirror holding the same layers for the other direction) into
 * the step's global loads, and, when update_bias (the step was applied) and
 * model.moe.bias_update_rate > 0, each layer's balancing bias moved by them (moe_update_bias).
 * Every rank calls it once per step. Without whole parameters (ZeRO-3: the sharding layer holds
 * them) the bias is not updated in place: add(ctx, i, delta) gets parameter i's increment (its
 * whole E floats) for the sharding layer to add to what it holds. */
typedef void (*model_sum_fn)(void *ctx, float *x, int64_t n);
typedef void (*model_param_add_fn)(void *ctx, int param, const float *delta);
void model_moe_end_step(model *m, model_sum_fn sum, int update_bias, model_param_add_fn add,
                        void *ctx);
/* For the i-th layer model_moe_stats lists: the rows each ep rank's experts computed in the last
 * step, per rank holding them (global counts / (dp/ep * cp * tp)); returns how many (the ep size,
 * at most max). */
int model_moe_rank_rows(const model *m, int i, double *rows, int max);
/* For the i-th layer model_moe_stats lists: the tokens routed to each expert in the last step
 * (its global counts); returns how many (the number of experts, at most max). */
int model_moe_expert_load(const model *m, int i, double *counts, int max);
/* For the i-th layer model_moe_stats lists: the range (max - min over the experts) of its
 * aux-loss-free balancing bias as it stands; NaN without a bias (model.moe.bias_update_rate 0).
 * Without whole parameters (ZeRO-3: each rank holds a shard of it) get(ctx, i, host) gives
 * parameter i's whole tensor (collective over the ranks holding its shards: they all call this
 * for the same layers; NULL get: NaN). */
typedef void (*model_param_get_fn)(void *ctx, int param, float *host);
double model_moe_bias_range(model *m, int i, model_param_get_fn get, void *ctx);
/* QK-clip (optimizer.qk_clip_threshold, docs/training.md#qk-clip). While table (L x Hg floats,
 * device) is set, each training forward max-accumulates into row l, at this rank's query heads,
 * every head's largest pre-softmax logit (model_qk_row: NULL when not tracking); NULL stops it
 * (validation). After the step's update, global (host) holds every rank's table max-reduced: each
 * query head of this rank's layers whose max exceeds tau, eta = tau / max, has its q rows and bias
 * scaled by sqrt(eta), and each key/value head by sqrt(the least eta of the query heads sharing
 * it), through scale(ctx, i, f, per): parameter i's element e, of what this rank holds of it, by
 * f[e / per] (per: a head's elements of the tensor-parallel slice). */
typedef void (*model_param_scale_fn)(void *ctx, int param, const float *f, int64_t per);
void model_qk_track(model *m, float *table);
float *model_qk_row(const model *m, int l);
void model_qk_clip(model *m, const float *global, double tau, model_param_scale_fn scale,
                   void *ctx);
/* logging.stats_every's activation RMS at the blocks' outputs. While sq (2 x n_layer doubles,
 * host) is set, each training forward adds to sq[2l] the sum of squares of layer l's output (the
 * residual stream after the block: this rank's rows) and to sq[2l + 1] their count of elements,
 * each row counted once over the tensor-parallel group (under sp each rank its rows, else tp rank
 * 0 the replicated ones), so the sums over every rank are the global batch's; a full recompute's
 * rerun adds nothing. NULL stops it (validation's forwards are not the step's). */
void model_act_track(model *m, double *sq);
/* The unit holds a MoE layer's experts: its gradients are reduced over expert-dp x cp. */
int model_unit_is_expert(const model *m, int unit);

#endif
