/* dp: data parallelism with ZeRO stages 0-3 over the ranks that hold replicas of the same
 * shard and see different tokens (the dp x cp group: data-parallel replicas and the
 * context-parallel parts of each sequence).
 * dp owns this rank's trainable state (fp32 master weights, gradients, AdamW moments) and lends
 * it to the model through unit pointers and hooks; every unit is split into n equal shards.
 * The ZeRO stages are described at dp_model_storage.
 * Gradients are summed: the loss scale already divides by the global batch's token count. */
#ifndef UST_DP_H
#define UST_DP_H

#include <stdint.h>

#include "ckpt.h"
#include "comm.h"
#include "config.h"
#include "mem.h"
#include "model.h"
#include "ops.h"

typedef struct dp_state dp_state;

/* The ZeRO stages:
 *   stage 0: everything whole; gradients all-reduced in buckets of ~dp_bucket_mb, each posted
 *            when its last unit's backward of the step's last micro-batch ends.
 *   stage 1: moments sharded; each unit's gradients reduce-scattered at that point, each rank
 *            updates its shard of the weights, then every unit is all-gathered.
 *   stage 2: as 1, and only the gradient shard is kept: a unit's gradients go to a working
 *            buffer and are reduce-scattered into the shard after every micro-batch.
 *   stage 3: weights sharded too: a unit is all-gathered before its forward and again before its
 *            backward, the next unit's gather posted ahead. The model splits the vocabulary
 *            tables (token embedding, lm_head or the tied copy) into row chunks of their own
 *            units, no larger than a layer (parallel.zero3_vocab_chunk_rows), so the embedding
 *            and the head gather and reduce one chunk at a time and a tied head gathers the
 *            table's chunks again at its end of the model: no unit is ever held whole beside
 *            the shards, and the working buffers are two gathered units and one (MoE: two)
 *            units' gradients.
 *
 * How the model must allocate itself for this stage and group size. */
model_storage dp_model_storage(const ust_config *cfg, int dp_size);
/* The groups a rank's gradients involve. */
typedef struct {
    ust_comm *dense;  /* dense gradients are reduced (and ZeRO-sharded) over it: the replicas
                         that see different tokens (dp x cp) */
    ust_comm *expert; /* expert units' gradients: expert-dp x cp (NULL without MoE) */
    ust_comm *ep;     /* the expert-parallel group: holds the other experts (NULL: none) */
    ust_comm *mp;     /* the other tensor-parallel shards of this replica (NULL: none): the
                         norm sums over it, and only its member 0 writes replicated tensors */
    ust_comm *pipe;   /* the other pipeline stages (NULL: none): the norm sums over it */
    ust_comm *mirror; /* the ranks holding copies of this rank's stages, laid out alike (dualpipe's
                         pipeline ranks r and pp-1-r; NULL or size 1: none): every gradient is
                         summed over it once reduced, so the copies take the same step */
    int dense_n, expert_n; /* the memory plan's dense and expert groups, which are NULL: their
                              sizes (this rank their member 0) */
} dp_groups;

/* Carves this rank's state from the arena and hooks it into m. Against a counting arena (the
 * memory plan's, train_build_rank) it only sizes: its groups may then be given by size alone. */
int dp_create(dp_state **out, const ust_config *cfg, const ust_ops *ops, ust_arena *arena, model *m,
              const dp_groups *groups, ust_err *e);
void dp_destroy(dp_state *d);

void dp_init_params(dp_state *d, uint64_t seed);
int dp_load_llmc(dp_state *d, const char *path, ust_err *e);
/* Adds delta (the whole tensor's numel floats, host) to parameter i's master weights as this
 * rank holds them (its ZeRO-3 shard, or the whole tensor): an update outside the optimizer,
 * the same on every rank (the MoE routing bias). A model_param_add_fn with ctx = d. */
void dp_add_to_param(void *d, int i, const float *delta);
/* Multiplies element e of parameter i's master weights, as this rank holds them (its ZeRO-3
 * shard, or the whole tensor), by f[e / per] (e counts over the whole tensor-parallel slice):
 * QK-clip's rescale, the same on every rank. A model_param_scale_fn with ctx = d. */
void dp_scale_param(void *d, int i, const float *f, int64_t per);
/* Parameter i's whole tensor into host (numel floats) on every rank of the group holding its
 * ZeRO-3 shards (collective there; without ZeRO-3 a copy): the MoE routing bias's range in the
 * metrics. A model_param_get_fn with ctx = d. */
void dp_param_whole(void *d, int i, float *host);
/* x (n floats, device) summed in place over the replicas whose tokens differ: the dense group,
 * then dualpipe's mirror. A model_sum_fn with ctx = d (the MoE layers' step loads). */
void dp_sum_replicas(void *d, float *x, int64_t n);
/* Starting weights from a reader of slices (hf_read_slice): asks for exactly what this rank
 * holds of each parameter (its tensor-parallel box, cut to its ZeRO-3 partition), so no rank
 * reads another's part. */
typedef int (*dp_read_fn)(void *ctx, const ckpt_tensor *t, const ckpt_slice *s, float *host,
                          ust_err *e);
int dp_load_slices(dp_state *d, dp_read_fn read, void *ctx, ust_err *e);

void dp_begin_step(dp_state *d);                 /* zero the gradients */
void dp_begin_microbatch(dp_state *d, int last); /* last: reduce as units finish */
void dp_finish_grads(dp_state *d); /* wait for every reduction, then sum with the mirror's */
double dp_grad_norm(dp_state *d);  /* global L2 norm (same on every rank) */
/* Muon's matrices step at lr, AdamW's groups at optim_group_lr x lr_mult (the batch ramp's
 * sqrt_lr factor, which lr already holds) */
void dp_optimizer_step(dp_state *d, double lr, double lr_mult, float grad_scale, int64_t step);
double dp_sum(dp_state *d, double x); /* all-reduce of one number over the group */
/* logging.stats_every (dp_stats.c): per group of parameters (group[i] for parameter i, in
 * 0..ngroups-1, the same on every rank), sums of squares over the whole model, each element
 * counted once as dp_grad_norm counts it, the same on every rank; collective. before (after
 * dp_grad_norm, before the update): the gradients' into gsq, and the parameters kept; after (the
 * update made): the parameters' into wsq and the update's (now - kept) into usq. */
void dp_stats_before(dp_state *d, const int *group, int ngroups, double *gsq);
void dp_stats_after(dp_state *d, const int *group, int ngroups, double *wsq, double *usq);

/* Checkpoints: the model's tensors and the optimizer's state: AdamW's two moments
 * ("<name>.exp_avg", "<name>.exp_avg_sq"), Muon's momentum ("<name>.momentum_buffer"). */
int dp_save(dp_state *d, ckpt_writer *w, ust_err *e);
int dp_load(dp_state *d, ckpt_reader *r, ust_err *e);
/* The weights only; the optimizer state stays zero (optimizer.reset_state: another optimizer's
 * checkpoint). */
int dp_load_weights(dp_state *d, ckpt_reader *r, ust_err *e);
/* The bytes dp_save writes from this rank (its partition of the parameters and both moments):
 * the size of checkpoint.async's staging buffer. */
int64_t dp_save_bytes(const dp_state *d);

/* The gradient the optimizer will read for parameter i on this rank (its ZeRO partition of the
 * tensor, or the whole tensor without sharding) and its length; NULL when it holds none. Valid
 * after dp_finish_grads: tied embeddings sum it with the other pipeline end's copy. */
float *dp_grad_piece(dp_state *d, int i, int64_t *n);

/* Bytes this rank's dp group sent in the last step (for the analytic-volume tests). */
uint64_t dp_bytes_sent(const dp_state *d);

#endif
