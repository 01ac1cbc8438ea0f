#include "plan.h"

#include "log.h"

static int64_t r16(int64_t x) { return (x + 15) / 16 * 16; }

/* The model's flat buffer in floats, unit by unit as core/model lays it out: every tensor
 * aligned to 16 floats, every unit padded to a multiple of 16 * dp so it shards evenly. */
typedef struct {
    int64_t emb, layer, head, total, n_params;
} unit_sizes;

static unit_sizes units(const ust_config *c) {
    int64_t C = c->model.d_model, D = cfg_head_dim(c), HD = c->model.n_head * D,
            KV = c->model.n_kv_head * D, F = c->model.d_ff, Vp = cfg_vocab_padded(c);
    int64_t L = c->model.n_layer, pad = 16 * (int64_t)c->parallel.dp * c->parallel.cp;
    int gpt2 = c->model.arch == ARCH_GPT2;
    unit_sizes u;
    int64_t lay[] = {C, C * HD, C * KV, C * KV, HD * C, C, F * C, F * C, C * F};
    int64_t lay_gpt2[] = {C, C, C * HD, HD, C * KV, KV, C * KV, KV, HD * C, C, C, C, F * C, F, C * F, C};
    int64_t sum = 0, n = 0;
    if (gpt2)
        for (size_t i = 0; i < sizeof lay_gpt2 / sizeof lay_gpt2[0]; i++)
            sum += r16(lay_gpt2[i]), n += lay_gpt2[i];
    else
        for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) sum += r16(lay[i]), n += lay[i];
#define PAD(x) (((x) + pad - 1) / pad * pad)
    u.layer = PAD(sum);
    u.emb = PAD(r16(Vp * C) + (gpt2 ? r16((int64_t)c->model.max_seq_len * C) : 0));
    u.head = PAD(r16(C) + (gpt2 ? r16(C) : 0) + (cfg_tied(c) ? 0 : r16(Vp * C)));
#undef PAD
    u.total = u.emb + L * u.layer + u.head;
    u.n_params = Vp * C + (gpt2 ? (int64_t)c->model.max_seq_len * C : 0) + L * n +
                 (gpt2 ? 2 * C : C) + (cfg_tied(c) ? 0 : Vp * C);
    return u;
}

/* floats one layer keeps for backward for one micro-batch (mirrors the model's saved tensors) */
static int64_t layer_act_floats(const ust_config *c, int64_t N, int with_mlp_act) {
    int64_t C = c->model.d_model, D = cfg_head_dim(c), HD = c->model.n_head * D,
            KV = c->model.n_kv_head * D, F = c->model.d_ff, llama = c->model.arch == ARCH_LLAMA;
    int64_t B = c->train.micro_batch_size, T = c->train.seq_len / c->parallel.cp;
    return 3 * N * C + 4 * N + 2 * N * HD + 2 * N * KV + B * c->model.n_head * T +
           (llama ? 2 : 1) * N * F + (with_mlp_act ? N * F : 0);
}

void plan_memory(const ust_config *c, mem_plan *p) {
    /* a rank holds seq_len / cp tokens of each sequence; ZeRO shards over dp x cp */
    int64_t N = (int64_t)c->train.micro_batch_size * c->train.seq_len / c->parallel.cp;
    int64_t C = c->model.d_model;
    int64_t D = cfg_head_dim(c), HD = c->model.n_head * D, KV = c->model.n_kv_head * D;
    int64_t F = c->model.d_ff, L = c->model.n_layer, Vp = cfg_vocab_padded(c);
    int dp = c->parallel.dp * c->parallel.cp, zero = c->optimizer.zero_stage;
    unit_sizes u = units(c);
    double P = (double)u.total * 4.0 / (c->parallel.tp * c->parallel.pp), shard = P / dp;
    double big = 4.0 * (double)(u.layer > u.head ? u.layer : u.head); /* largest unit but 0 */
    double emb = 4.0 * (double)u.emb;
    p->n_params = u.n_params;
    /* ZeRO (Playbook): stage 1 shards the optimizer state, 2 the gradients too, 3 the weights
     * too; 2 and 3 add working buffers for one unit (gradients) and 3 for gathered units */
    p->params = zero >= 3 ? shard + emb + 2 * big : P;
    p->grads = zero >= 2 ? shard + emb + big : P;
    p->optim = zero >= 1 ? 2 * shard : 2 * P;
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
    p->comm = 16.0 + 4.0; /* dp_sum's four floats, the stop flag */
    p->total = p->params + p->grads + p->optim + p->acts + p->comm;
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
    fprintf(f, "  total       %12s  (%.0f bytes)\n", log_bytes(b[4], 32, p->total), p->total);
    fprintf(f, "by ZeRO stage at dp=%d (per rank):\n  stage   parameters    gradients    optimizer"
               "        total\n", c->parallel.dp);
    for (int z = 0; z <= 3; z++) {
        ust_config other = *c;
        other.optimizer.zero_stage = z;
        mem_plan q;
        plan_memory(&other, &q);
        char s[4][32];
        fprintf(f, "  %5d %12s %12s %12s %12s%s\n", z, log_bytes(s[0], 32, q.params),
                log_bytes(s[1], 32, q.grads), log_bytes(s[2], 32, q.optim),
                log_bytes(s[3], 32, q.total), z == c->optimizer.zero_stage ? "  <- this run" : "");
    }
}
