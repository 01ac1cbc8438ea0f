#include "plan.h"

#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "moe.h"
#include "pp_schedule.h" /* pure: the schedule decides how many micro-batches a stage holds */

static int64_t r16(int64_t x) { return (x + 15) / 16 * 16; }

/* This rank's shapes: heads, hidden units and vocabulary rows split over tp; the tokens of a
 * micro-batch split over cp (and, outside the tensor-parallel halves, over tp under sp). */
typedef struct {
    int64_t C, D, H, Hkv, HD, KV, F, Vp, Vl, L, B, T, Tl, N, Nl, t, cp, maxT;
    int gpt2, llama, tied;
} shapes;

static shapes shapes_of(const ust_config *c) {
    shapes s;
    s.t = c->parallel.tp, s.cp = c->parallel.cp;
    s.C = c->model.d_model, s.D = cfg_head_dim(c), s.L = c->model.n_layer;
    s.H = c->model.n_head / s.t, s.Hkv = c->model.n_kv_head / s.t;
    s.HD = s.H * s.D, s.KV = s.Hkv * s.D, s.F = c->model.d_ff / s.t;
    s.Vp = cfg_vocab_padded(c), s.Vl = s.Vp / s.t, s.maxT = c->model.max_seq_len;
    s.B = c->train.micro_batch_size, s.T = c->train.seq_len, s.Tl = s.T / s.cp;
    s.N = s.B * s.Tl;
    s.Nl = c->parallel.sp && s.t > 1 ? s.N / s.t : s.N;
    s.gpt2 = c->model.arch == ARCH_GPT2, s.llama = !s.gpt2, s.tied = cfg_tied(c);
    return s;
}

/* The model's flat buffer on this rank in floats, unit by unit as core/model lays it out: every
 * tensor aligned to 16 floats, every unit padded to a multiple of 16 * (dp x cp) so it shards
 * evenly. n_params counts the whole model. */
typedef struct {
    int64_t emb, layer, head, total, n_params;
    int64_t tied_copy; /* tied embeddings over a pipeline: the last stage's head unit */
    int64_t moe_dense, moe_experts; /* a MoE layer's two units (attention, router, shared expert;
                                       this rank's experts) */
} unit_sizes;

/* Counts a MoE layer's tensors as the model lays them out (16-float aligned) and whole. */
typedef struct {
    int64_t dense, experts, whole;
} moe_count;

static void count_moe_param(void *ctx, const moe_param *q) {
    moe_count *k = ctx;
    *(q->expert >= 0 ? &k->experts : &k->dense) += r16(q->rows * q->cols);
}

static void count_moe_whole(void *ctx, const moe_param *q) {
    ((moe_count *)ctx)->whole += q->rows * q->cols;
}

static unit_sizes units(const ust_config *c) {
    shapes s = shapes_of(c);
    int64_t C = s.C, pad = 16 * (int64_t)c->parallel.dp * c->parallel.cp, t = s.t;
    int64_t lay[] = {C, s.HD * C, s.KV * C, s.KV * C, C * s.HD, C, s.F * C, s.F * C, C * s.F};
    int64_t lay_gpt2[] = {C,        C, s.HD * C, s.HD, s.KV * C, s.KV, s.KV * C, s.KV,
                          C * s.HD, C, C,        C,    s.F * C,  s.F,  C * s.F,  C};
    const int64_t *list = s.gpt2 ? lay_gpt2 : lay;
    size_t count = s.gpt2 ? sizeof lay_gpt2 / sizeof lay_gpt2[0] : sizeof lay / sizeof lay[0];
    int64_t sum = 0, whole = 0;
    for (size_t i = 0; i < count; i++) sum += r16(list[i]);
    /* whole-model count: the split tensors times t, the replicated ones (norms, row-parallel
     * biases) once */
    int64_t repl = s.gpt2 ? 6 * C : 2 * C; /* norm weights (+ biases), o/down biases */
    for (size_t i = 0; i < count; i++) whole += list[i];
    whole = (whole - repl) * t + repl;
    unit_sizes u;
#define PAD(x) (((x) + pad - 1) / pad * pad)
    u.layer = PAD(sum);
    u.emb = PAD(r16(s.Vl * C) + (s.gpt2 ? r16(s.maxT * C) : 0));
    u.head = PAD(r16(C) + (s.gpt2 ? r16(C) : 0) + (s.tied ? 0 : r16(s.Vl * C)));
    u.tied_copy = 0;
    if (s.tied && c->parallel.pp > 1) { /* the last stage's copy; both units one common length */
        int64_t head = PAD(r16(s.Vl * C) + r16(C) * (s.gpt2 ? 2 : 1));
        u.tied_copy = u.emb > head ? u.emb : head;
        u.emb = u.tied_copy;
    }
    u.total = 0; /* per pipeline rank: plan_stage */
    u.n_params = s.Vp * C + (s.gpt2 ? s.maxT * C : 0) + s.L * whole + (s.gpt2 ? 2 * C : C) +
                 (s.tied ? 0 : s.Vp * C);
    u.moe_dense = u.moe_experts = 0;
    if (c->model.moe.num_experts > 0) {
        /* a MoE layer: the attention half of a layer, then the MoE tensors (whole: no tp) */
        int64_t attn = 0, attn_whole = 0, mlp = s.gpt2 ? 4 : 3;
        for (size_t i = 0; i + mlp < count; i++) attn += r16(list[i]), attn_whole += list[i];
        int64_t arepl = s.gpt2 ? 5 * C : 2 * C; /* norms (+ biases), o_proj's bias */
        attn_whole = (attn_whole - arepl) * t + arepl;
        moe_count k = {0}, w = {0};
        moe_enum_params(c, 0, c->parallel.ep, 0, NULL, NULL, count_moe_param, &k);
        moe_enum_params(c, 0, 1, 0, NULL, NULL, count_moe_whole, &w);
        u.moe_dense = PAD(attn + k.dense);
        u.moe_experts = PAD(k.experts);
        for (int l = 0; l < s.L; l++)
            if (moe_layer_is_moe(c, l)) u.n_params += attn_whole + w.whole - whole;
    }
#undef PAD
    return u;
}

/* Bytes one layer keeps for backward for one micro-batch (mirrors the model's saved tensors):
 * activations of a bytes, norm statistics and lse fp32. */
static int64_t layer_act_bytes(const shapes *s, int with_mlp_act, int a) {
    int64_t acts = 3 * s->Nl * s->C + 2 * s->N * s->HD + 2 * s->N * s->KV +
                   (s->llama ? 2 : 1) * s->N * s->F + (with_mlp_act ? s->N * s->F : 0);
    return a * acts + 4 * (4 * s->Nl + s->B * s->H * s->Tl);
}

/* Bytes of the tensor- and context-parallel scratch buffers: MEM_ACTS returned, MEM_COMM in
 * *comm. */
static int64_t parallel_scratch(const ust_config *c, const shapes *s, int a, int64_t *comm) {
    int64_t acts = 0, four = 0;
    *comm = 0;
    if (s->t > 1) *comm += 4 * (s->t + 1) * s->N + a * 2 * s->N; /* vocab-parallel loss */
    if (c->parallel.sp && s->t > 1) acts += 3 * s->N * s->C + s->N * s->C / s->t, four += 2 * s->C;
    if (s->cp > 1) {
        int64_t blk = s->B * s->Tl * s->Hkv * s->D;
        acts += 2 * blk + (c->parallel.cp_comm == CP_RING ? 8 * blk : 4 * s->cp * blk);
        acts += s->B * s->Tl * s->H * s->D, four += s->B * s->H * s->Tl;
    }
    return a * acts + 4 * four;
}

/* What pipeline rank r holds: its chunks' units, the first of them, the largest other one, and
 * the activation bytes of the micro-batches it keeps in flight (activation sets per chunk from
 * the schedule itself). Without a pipeline: the whole model, one set. */
typedef struct {
    int64_t total, first, big, slot_acts;
    int64_t experts; /* of total: expert units (sharded over expert-dp x cp) */
} stage_plan;

static stage_plan plan_stage(const ust_config *c, const shapes *s, const unit_sizes *u, int r) {
    int p = c->parallel.pp, v = c->parallel.vpp, S = p * v;
    int64_t N = s->N, Nl = s->Nl, C = s->C, a = cfg_act_size(c);
    int zb = p > 1 && c->parallel.pp_schedule == PP_ZB;
    int slots[16] = {1};
    pps_schedule sched;
    ust_err e;
    if (p > 1 && pps_build(&sched, c->parallel.pp_schedule, p, v, cfg_grad_accum(c), r,
                           c->parallel.pp_breadth_first ? PPS_BREADTH_FIRST : 0, &e) == 0) {
        pps_slots(&sched, NULL, slots);
        pps_free(&sched);
    }
    int64_t layer = c->train.recompute == RECOMPUTE_FULL        ? 0
                    : c->train.recompute == RECOMPUTE_SELECTIVE ? layer_act_bytes(s, 0, a)
                                                                : layer_act_bytes(s, 1, a);
    int64_t wsave = a * (2 * N * C + (s->llama ? 2 : 1) * N * s->F + 2 * Nl * C + N * s->HD +
                         2 * N * s->KV); /* zb: the output gradients W needs, per layer */
    /* a MoE layer keeps its own MLP state instead of the dense MLP's */
    int64_t dense_mlp = c->train.recompute == RECOMPUTE_FULL
                            ? 0
                            : a * ((s->llama ? 2 : 1) * N * s->F +
                                   (c->train.recompute == RECOMPUTE_SELECTIVE ? 0 : N * s->F));
    int full = c->train.recompute == RECOMPUTE_FULL, moe = c->model.moe.num_experts > 0;
    int64_t moe_acts = moe ? moe_acts_bytes(c, (int)N, c->parallel.ep) : 0;
    int64_t moe_layer = layer - dense_mlp + (full ? 0 : moe_acts); /* full: one shared set */
    stage_plan st = {0};
    int nunits = 0;
    for (int ch = 0; ch < v; ch++) {
        int stage = ch * p + r, embed = stage == 0, head = stage == S - 1, lo = 0, hi = s->L;
        if (S > 1) cfg_stage_layers(c, stage, &lo, &hi);
        int64_t per = hi - lo, layers_acts = 0;
        /* the units in the model's order: embedding, layers (a MoE layer has two), head (with
         * the tied copy) */
        int64_t head_unit = u->tied_copy && !embed ? u->tied_copy : u->head;
        int64_t lens[3];
        for (int64_t k = -embed; k < per + head; k++) {
            int moe = k >= 0 && k < per && moe_layer_is_moe(c, (int)(lo + k)), n = 1;
            lens[0] = k < 0 ? u->emb : k >= per ? head_unit : moe ? u->moe_dense : u->layer;
            if (moe) lens[n++] = u->moe_experts;
            for (int i = 0; i < n; i++) {
                st.total += lens[i];
                if (moe && i == 1) st.experts += lens[i];
                if (nunits++ == 0)
                    st.first = lens[i];
                else if (lens[i] > st.big)
                    st.big = lens[i];
            }
            if (k >= 0 && k < per) layers_acts += moe ? moe_layer : layer;
        }
        /* one set: residual stream, saved layers, gradient buffer, head or tokens */
        int64_t set = a * (per + 1) * Nl * C + layers_acts + (zb ? per * wsave : 0) + a * Nl * C;
        if (head) set += a * (Nl * C + N * s->Vl + (zb ? Nl * C : 0)) + 4 * 2 * Nl;
        if (embed) set += 4 * N; /* token ids (int32) */
        st.slot_acts += slots[ch] * set;
    }
    return st;
}

/* The plan of pipeline rank r (every rank without a pipeline). */
static void plan_rank(const ust_config *c, int r, mem_plan *p) {
    shapes s = shapes_of(c);
    int dp = c->parallel.dp * c->parallel.cp, zero = c->optimizer.zero_stage; /* ZeRO group */
    unit_sizes u = units(c);
    stage_plan st = plan_stage(c, &s, &u, r);
    int edp = c->parallel.dp / c->parallel.ep * c->parallel.cp; /* the experts' ZeRO group */
    double P = (double)st.total * 4.0;
    double shard = 4.0 * ((double)(st.total - st.experts) / dp + (double)st.experts / edp);
    double big = 4.0 * (double)st.big;   /* largest unit but the first */
    double emb = 4.0 * (double)st.first; /* the first unit has its own working buffer */
    p->n_params = u.n_params;
    /* ZeRO (Playbook): stage 1 shards the optimizer state, 2 the gradients too, 3 the weights
     * too; 2 and 3 add working buffers for two units' gradients (one filling while the other
     * reduces) and 3 two gathered units (one in use, the next prefetched) */
    p->params = zero >= 3 ? shard + emb + 2 * big : P;
    p->grads = zero >= 2 ? shard + emb + 2 * big : P;
    p->optim = zero >= 1 ? 2 * shard : 2 * P;
    int64_t N = s.N, Nl = s.Nl, C = s.C, a = cfg_act_size(c);
    int zb = c->parallel.pp > 1 && c->parallel.pp_schedule == PP_ZB;
    int64_t acts = st.slot_acts;                                        /* bytes */
    if (c->train.recompute == RECOMPUTE_SELECTIVE) acts += a * N * s.F; /* the shared MLP output */
    if (c->train.recompute == RECOMPUTE_FULL) acts += layer_act_bytes(&s, 1, a); /* scratch set */
    acts += 4 * N; /* per-token losses */
    acts += a * (Nl * C + N * C + N * s.HD + 2 * N * s.KV + N * (s.HD > s.F ? s.HD : s.F) +
                 (s.llama ? 3 : 1) * N * s.F); /* backward scratch */
    acts += 4 * (N + s.T);                     /* targets, positions (int32) */
    if (c->model.moe.num_experts > 0) acts += moe_ctx_bytes(c, (int)N, c->parallel.ep);
    if (c->model.moe.num_experts > 0 && c->train.recompute == RECOMPUTE_FULL)
        acts += moe_acts_bytes(c, (int)N, c->parallel.ep); /* the shared MoE set */
    int64_t comm;
    acts += parallel_scratch(c, &s, (int)a, &comm);
    if (zb && !(c->parallel.sp && s.t > 1)) acts += 4 * 2 * C; /* B's dropped norm gradient */
    p->acts = (double)acts;
    int pp = c->parallel.pp;
    /* dp_sum's four floats, the stop flag, tp scratch, the pipeline executor's scalars */
    p->comm = 16.0 + 4.0 + (double)comm + 20.0 * pp;
    p->total = p->params + p->grads + p->optim + p->acts + p->comm;
}

void plan_memory(const ust_config *c, mem_plan *p) { plan_rank(c, 0, p); }

void plan_memory_rank(const ust_config *c, int pp_rank, mem_plan *p) { plan_rank(c, pp_rank, p); }

double plan_memory_peak(const ust_config *c) {
    double peak = 0;
    for (int r = 0; r < c->parallel.pp; r++) {
        mem_plan q;
        plan_rank(c, r, &q);
        if (q.total > peak) peak = q.total;
    }
    return peak;
}

int plan_check_fits(const ust_config *c, ust_err *e) {
    char need[32], one[32], have[32];
    const __typeof__(c->parallel) *l = &c->parallel;
    if (c->run.device == DEV_CUDA) {
        double peak = plan_memory_peak(c);
        if (peak <= PLAN_MAX_DEVICE_BYTES) return 0;
        return ust_errf(e,
                        "%s: the memory plan needs %s (%.0f bytes) on the busiest rank; no GPU has "
                        "more than %s: shard the model (parallel.tp, pp, cp, ep; "
                        "optimizer.zero_stage) or shrink it, the batch or train.seq_len",
                        c->source, log_bytes(need, 32, peak), peak,
                        log_bytes(have, 32, PLAN_MAX_DEVICE_BYTES));
    }
    /* ranks differ only by pipeline stage: each stage's plan is held by dp * tp * cp ranks */
    double total = 0, peak = 0, per_stage = (double)l->dp * l->tp * l->cp;
    for (int r = 0; r < l->pp; r++) {
        mem_plan q;
        plan_rank(c, r, &q);
        total += q.total * per_stage;
        if (q.total > peak) peak = q.total;
    }
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (ram <= 0 || total <= ram) return 0;
    long long ranks = (long long)per_stage * l->pp;
    return ust_errf(e,
                    "%s: the memory plan needs %s (%.0f bytes) for the %lld rank%s of this layout "
                    "on run.device cpu (up to %s each), but this machine has %s of physical "
                    "memory: shrink the model, the batch or train.seq_len, or shard it "
                    "(optimizer.zero_stage, train.recompute)",
                    c->source, log_bytes(need, 32, total), total, ranks, ranks == 1 ? "" : "s",
                    log_bytes(one, 32, peak), log_bytes(have, 32, ram));
}

void plan_print(const ust_config *c, const mem_plan *p, FILE *f) {
    char b[5][32];
    fprintf(f, "memory plan per rank (%s; ZeRO-%d over dp=%d; recompute %s):\n",
            cfg_act_size(c) == 2 ? "fp32, activations bf16" : "fp32", c->optimizer.zero_stage,
            c->parallel.dp,
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
    if (c->parallel.pp > 1) {
        fprintf(f, "by pipeline rank (stages r, r+pp, ...; micro-batches in flight per %s):\n",
                c->parallel.pp_schedule == PP_AFAB ? "afab: all of them" : "the schedule");
        for (int r = 0; r < c->parallel.pp; r++) {
            mem_plan q;
            char s[3][32];
            plan_rank(c, r, &q);
            fprintf(f, "  pp rank %-3d parameters %10s  activations %10s  total %10s\n", r,
                    log_bytes(s[0], 32, q.params), log_bytes(s[1], 32, q.acts),
                    log_bytes(s[2], 32, q.total));
        }
    }
    fprintf(f,
            "by ZeRO stage at dp=%d (per rank):\n  stage   parameters    gradients    optimizer"
            "        total\n",
            c->parallel.dp);
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
