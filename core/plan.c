#include "plan.h"

#include "log.h"

static int64_t layer_params(const ust_config *c) {
    int64_t C = c->model.d_model, D = cfg_head_dim(c), HD = c->model.n_head * D,
            KV = c->model.n_kv_head * D, F = c->model.d_ff;
    if (c->model.arch == ARCH_LLAMA) return 2 * C + C * HD + 2 * C * KV + HD * C + 3 * C * F;
    return 4 * C + (C * HD + HD) + 2 * (C * KV + KV) + (HD * C + C) + (C * F + F) + (F * C + C);
}

static int64_t model_params(const ust_config *c) {
    int64_t C = c->model.d_model, Vp = cfg_vocab_padded(c), gpt2 = c->model.arch == ARCH_GPT2;
    int64_t n = Vp * C + c->model.n_layer * layer_params(c) + (gpt2 ? 2 * C : C);
    if (gpt2) n += (int64_t)c->model.max_seq_len * C;
    if (!cfg_tied(c)) n += Vp * C;
    return n;
}

/* floats one layer keeps for backward for one micro-batch (mirrors the model's saved tensors) */
static int64_t layer_act_floats(const ust_config *c, int64_t N, int with_mlp_act) {
    int64_t C = c->model.d_model, D = cfg_head_dim(c), HD = c->model.n_head * D,
            KV = c->model.n_kv_head * D, F = c->model.d_ff, llama = c->model.arch == ARCH_LLAMA;
    int64_t B = c->train.micro_batch_size, T = c->train.seq_len;
    return 3 * N * C + 4 * N + 2 * N * HD + 2 * N * KV + B * c->model.n_head * T +
           (llama ? 2 : 1) * N * F + (with_mlp_act ? N * F : 0);
}

void plan_memory(const ust_config *c, mem_plan *p) {
    int64_t N = (int64_t)c->train.micro_batch_size * c->train.seq_len, C = c->model.d_model;
    int64_t D = cfg_head_dim(c), HD = c->model.n_head * D, KV = c->model.n_kv_head * D;
    int64_t F = c->model.d_ff, L = c->model.n_layer, Vp = cfg_vocab_padded(c);
    int dp = c->parallel.dp, zero = c->optimizer.zero_stage;
    int64_t model_par = c->parallel.tp * c->parallel.pp;
    p->n_params = model_params(c);
    double local = (double)p->n_params / model_par * 4.0;
    p->params = zero >= 3 ? local / dp : local;
    p->grads = zero >= 2 ? local / dp : local;
    p->optim = zero >= 1 ? 2 * local / dp : 2 * local;
    /* saved per layer, plus the residual stream, head and backward scratch */
    int64_t per_layer, sets;
    switch (c->train.recompute) {
    case RECOMPUTE_FULL: per_layer = layer_act_floats(c, N, 1), sets = 1; break;
    case RECOMPUTE_SELECTIVE: per_layer = layer_act_floats(c, N, 0), sets = L; break;
    default: per_layer = layer_act_floats(c, N, 1), sets = L;
    }
    int64_t acts = sets * per_layer + (c->train.recompute == RECOMPUTE_SELECTIVE ? N * F : 0);
    acts += (L + 1) * N * C;                       /* residual stream */
    acts += N * C + 2 * N + N * Vp + N;            /* final norm, logits, losses */
    acts += 3 * N * C + N * HD + 2 * N * KV + N * (HD > F ? HD : F) +
            (c->model.arch == ARCH_LLAMA ? 3 : 2) * N * F; /* backward scratch */
    acts += 2 * N + c->train.seq_len;              /* tokens, targets, positions (int32) */
    p->acts = (double)acts * 4.0;
    p->total = p->params + p->grads + p->optim + p->acts;
}

void plan_print(const ust_config *c, const mem_plan *p, FILE *f) {
    char b[5][32];
    fprintf(f, "memory plan per rank (fp32; ZeRO-%d over dp=%d; recompute %s):\n",
            c->optimizer.zero_stage, c->parallel.dp,
            c->train.recompute == RECOMPUTE_FULL        ? "full"
            : c->train.recompute == RECOMPUTE_SELECTIVE ? "selective"
                                                        : "none");
    fprintf(f, "  parameters  %12s  (%lld in the model)\n", log_bytes(b[0], 32, p->params),
            (long long)p->n_params);
    fprintf(f, "  gradients   %12s\n", log_bytes(b[1], 32, p->grads));
    fprintf(f, "  optimizer   %12s  (AdamW m and v)\n", log_bytes(b[2], 32, p->optim));
    fprintf(f, "  activations %12s  (one micro-batch of %d x %d tokens)\n",
            log_bytes(b[3], 32, p->acts), c->train.micro_batch_size, c->train.seq_len);
    fprintf(f, "  total       %12s\n", log_bytes(b[4], 32, p->total));
}
