/* ops: the backend factory (see ops.h). The one place above cuda/ that names the CUDA backend:
 * everything else gets a ust_ops and never asks which one it is. */
#include "ops.h"

#include "ops_cuda.h"

#include <stddef.h>

/* The list must name every function member: a member left out of it would stay NULL in every
 * backend, and the profiler would not wrap it. Members after the first op are all function
 * pointers of one size, so counting them checks the list against the struct. */
#define UST_OPS_ONE(op) +1
_Static_assert(sizeof(ust_ops) == offsetof(ust_ops, alloc) +
                                      (0 UST_OPS_LIST(UST_OPS_ONE)) * sizeof(void (*)(void)),
               "UST_OPS_LIST (ops.h) must name every function member of ust_ops");
#undef UST_OPS_ONE

ust_rope ops_rope(const ust_config *c) {
    ust_rope r = {.theta = c->model.rope_theta};
    if (c->model.partial_rotary_factor < 1) /* transformers: int(head_dim * factor) */
        r.rot = (int)(cfg_head_dim(c) * c->model.partial_rotary_factor);
    if (c->model.rope_scaling.type == ROPE_LLAMA3) {
        const __typeof__(c->model.rope_scaling) *rs = &c->model.rope_scaling;
        r.factor = rs->factor;
        r.low_freq_factor = rs->low_freq_factor;
        r.high_freq_factor = rs->high_freq_factor;
        r.original_max_pos = rs->original_max_position_embeddings;
    }
    if (c->model.rope_scaling.type == ROPE_YARN) {
        const __typeof__(c->model.rope_scaling) *rs = &c->model.rope_scaling;
        r.factor = rs->factor;
        r.original_max_pos = rs->original_max_position_embeddings;
        r.yarn = 1, r.truncate = rs->truncate;
        r.beta_fast = rs->beta_fast, r.beta_slow = rs->beta_slow;
        /* transformers' default: 0.1 ln(factor) + 1 (yarn_get_mscale) */
        r.attn = rs->attention_factor > 0 ? rs->attention_factor
                 : rs->factor > 1         ? 0.1 * log(rs->factor) + 1.0
                                          : 1.0;
    }
    if (c->model.rope_scaling.type == ROPE_LINEAR)
        r.linear = 1, r.factor = c->model.rope_scaling.factor;
    double s = c->model.gemma.query_pre_attn_scalar;
    if (s > 0) r.attn = (r.attn > 0 ? r.attn : 1.0) * pow(cfg_head_dim(c) / s, 0.25);
    return r;
}

ust_rope ops_rope_local(const ust_config *c) {
    ust_rope g = ops_rope(c), r = {.theta = c->model.gemma.rope_local_theta, .rot = g.rot};
    double s = c->model.gemma.query_pre_attn_scalar;
    if (s > 0) r.attn = pow(cfg_head_dim(c) / s, 0.25);
    return r;
}

ust_ops *ops_create(const ust_config *cfg, int local_rank, int local_world, ust_err *e) {
    if (cfg->run.device != DEV_CUDA) return ops_cpu_create(cfg->train.threads, local_world);
    /* without CUDA compiled in, ops_cuda_create fails with a message saying how to build it */
    ust_ops *o = ops_cuda_create(local_rank, e);
    if (o) ops_cuda_set_bf16(o, cfg->train.precision == PREC_BF16);
    if (o) o->nondeterministic = !cfg->run.deterministic;
    return o;
}
