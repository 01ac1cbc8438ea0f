#include "progress.h"
#include "planner.h"

#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "plan.h"
#include "planner_cp.h"
#include "pp_schedule.h"

const char *const planner_group_names[PLAN_NGROUPS] = {"dp", "tp", "cp", "pp", "ep"};

void planner_hw_defaults(planner_hw *h) {
    h->peak_flops = 989e12;
    h->mfu = 0.4;
    h->bw_intra = 450e9;
    h->bw_inter = 50e9;
    h->gpus_per_node = 8;
    h->gpu_mem = 80.0 * (1 << 30);
}

/* parallel.pp_layers for S stages of L layers that S does not divide: as even as it gets, the
 * L % S extra layers on the stages after the first, so the first (with the embedding) and the
 * last (with the head and the loss) keep the fewer (61 layers on 16 stages: 3, 4 x 13, 3, 3,
 * DeepSeek-V3's split). "" (an even split) when S divides L, exceeds it, or the list is too
 * long for the field. */
static void uneven_layers(int L, int S, char *out, size_t cap) {
    out[0] = 0;
    if (S <= 1 || S > L || L % S == 0) return;
    size_t k = 0;
    for (int s = 0; s < S; s++) {
        int n = snprintf(out + k, cap - k, "%s%d", s ? "," : "", L / S + (s >= 1 && s <= L % S));
        if (n < 0 || (size_t)n >= cap - k) {
            out[0] = 0;
            return;
        }
        k += (size_t)n;
    }
}

void planner_apply(const ust_config *base, const planner_layout *l, ust_config *out) {
    *out = *base;
    out->parallel.dp = l->dp, out->parallel.tp = l->tp, out->parallel.pp = l->pp;
    out->parallel.vpp = l->vpp, out->parallel.cp = l->cp, out->parallel.ep = l->ep;
    out->parallel.sp = l->sp;
    out->parallel.pp_schedule = l->schedule;
    int S = l->pp > 1 && l->schedule == PP_DUALPIPE ? l->pp : l->pp * l->vpp;
    uneven_layers(base->model.n_layer, S, out->parallel.pp_layers, sizeof out->parallel.pp_layers);
    out->train.micro_batch_size = l->micro_batch;
    out->train.recompute = l->recompute;
    out->optimizer.zero_stage = l->zero;
}

/* ---------------------------------------------------------------- model sizes and FLOPs */

/* Latent attention's matmul weights and parameters per layer (model_mla.h): q through its latent
 * (q_a, its norm, q_b) or q_proj; kv_a to the latent and the shared rope key, its norm, kv_b up to
 * each head's nope key and value; o from H * v_head_dim. */
static void mla_sizes(const ust_config *c, double *mm, double *params) {
    const __typeof__(c->model.mla) *a = &c->model.mla;
    double C = c->model.d_model, H = c->model.n_head, Rq = a->q_lora_rank, Rkv = a->kv_lora_rank;
    double QK = H * cfg_head_dim(c);
    double q = Rq > 0 ? Rq * C + QK * Rq : QK * C;
    *mm = q + (Rkv + a->qk_rope_head_dim) * C + H * (a->qk_nope_head_dim + a->v_head_dim) * Rkv +
          C * H * a->v_head_dim;
    *params = *mm + 2 * C + Rkv + (Rq > 0 ? Rq : 0); /* the block's two norms, the latents' */
}

void planner_model_sizes(const ust_config *c, planner_sizes *s) {
    double C = c->model.d_model, F = c->model.d_ff, V = cfg_vocab_padded(c);
    double HD = (double)c->model.n_head * cfg_head_dim(c);
    double KV = (double)c->model.n_kv_head * cfg_head_dim(c);
    double Fe = c->model.moe.d_ff_expert, E = c->model.moe.num_experts;
    int gpt2 = c->model.arch == ARCH_GPT2, L = c->model.n_layer;
    memset(s, 0, sizeof *s);
    s->emb = V * C + (gpt2 ? (double)c->model.max_seq_len * C : 0);
    s->head = (gpt2 ? 2 * C : C) + (cfg_tied(c) ? 0 : V * C);
    double attn_mm = 2 * HD * C + 2 * KV * C; /* q, o; k, v */
    /* gpt2: LayerNorms with biases, biases on q, k, v, o */
    s->attn = attn_mm + (gpt2 ? 4 * C + HD + 2 * KV + C : 2 * C);
    if (c->model.mla.enabled) mla_sizes(c, &attn_mm, &s->attn);
    double mlp_mm = (gpt2 ? 2 : 3) * F * C, expert_mm = (gpt2 ? 2 : 3) * Fe * C;
    s->mlp = mlp_mm + (gpt2 ? F + C : 0);
    s->expert = expert_mm + (gpt2 ? Fe + C : 0);
    int shared = c->model.moe.shared_expert;
    double Fs = c->model.moe.shared_d_ff > 0 ? c->model.moe.shared_d_ff : Fe; /* its own width */
    double shared_mm = (gpt2 ? 2 : 3) * Fs * C;
    s->moe_dense = E * C + (shared ? shared_mm + (gpt2 ? Fs + C : 0) : 0);
    for (int l = 0; E > 0 && l < L; l++) s->n_moe += cfg_layer_is_moe(c, l);
    /* model.mtp's modules (model_mtp.h): two norms, the projection from 2C, the block (an MoE
     * layer in a model with experts: cfg_layer_is_moe of layers L..), the head's norm; each
     * computes logits again with the shared head */
    int D = c->model.mtp.depth, mtp_moe = D > 0 && E > 0 && cfg_layer_is_moe(c, L);
    double mtp_mlp = mtp_moe ? s->moe_dense + E * s->expert : s->mlp;
    double mtp_mlp_mm =
        mtp_moe ? E * C + c->model.moe.top_k * expert_mm + shared * shared_mm : mlp_mm;
    s->mtp = D * (2 * C + 2 * C * C + s->attn + mtp_mlp + C);
    s->mm_mtp = D * (2 * C * C + attn_mm + mtp_mlp_mm + V * C);
    s->n_params = s->emb + s->head + L * s->attn + (L - s->n_moe) * s->mlp +
                  s->n_moe * (s->moe_dense + E * s->expert) + s->mtp;
    /* the logits matmul runs whether or not lm_head is tied to the embedding */
    s->mm_dense = L * attn_mm + (L - s->n_moe) * mlp_mm + V * C + s->mm_mtp;
    s->mm_moe = s->n_moe * (E * C + c->model.moe.top_k * expert_mm + shared * shared_mm);
}

/* Every attention layer's scores and weighted sum per token (model_attention_flops: the keys of
 * the sequence or of a layer's window), the model.mtp modules' blocks included. */
static double attention_flops(const ust_config *c) {
    double f = 0;
    for (int l = 0; l < c->model.n_layer + c->model.mtp.depth; l++)
        f += model_attention_flops(c, l, c->train.seq_len);
    return f;
}

double planner_flops_per_token(const ust_config *c) {
    planner_sizes s;
    planner_model_sizes(c, &s);
    return 6.0 * (s.mm_dense + s.mm_moe) + attention_flops(c);
}

/* ---------------------------------------------------------------- collectives */

double planner_allreduce_s(double bytes, int n, double bw) {
    return n > 1 ? 2.0 * (n - 1) / n * bytes / bw : 0;
}
double planner_allgather_s(double bytes, int n, double bw) {
    return n > 1 ? (double)(n - 1) / n * bytes / bw : 0;
}
double planner_reducescatter_s(double bytes, int n, double bw) {
    return planner_allgather_s(bytes, n, bw);
}
double planner_alltoall_s(double bytes, int n, double bw) {
    return planner_allgather_s(bytes, n, bw);
}

int planner_intra_node(int stride, int size, int gpus_per_node) {
    long span = (long)stride * size;
    return span <= gpus_per_node && gpus_per_node % span == 0;
}

/* ---------------------------------------------------------------- the step estimate */

/* Gradients travel in fp32; activations (tp, cp, pp, ep) in the run's activation type
 * (cfg_act_size: bf16 on cuda under train.precision bf16). */
#define BYTES 4.0

/* DP: gradients of `params` over n ranks as ustrain's dp does it per ZeRO stage, m micro-batches:
 * 0 one all-reduce; 1 reduce-scatter + all-gather of the updated weights; 2 a reduce-scatter after
 * every micro-batch + the all-gather; 3 every micro-batch gathers the weights before forward and
 * again before backward and reduce-scatters the gradients. */
static double dp_time(double params, int n, double bw, int zero, int m) {
    double b = BYTES * params, rs = planner_reducescatter_s(b, n, bw);
    double ag = planner_allgather_s(b, n, bw);
    switch (zero) {
    case 0:
        return planner_allreduce_s(b, n, bw);
    case 1:
        return rs + ag;
    case 2:
        return m * rs + ag;
    default:
        return m * (2 * ag + rs);
    }
}

/* Every pipeline rank's activation sets (plan_activation_sets) of one (schedule, pp, vpp,
 * micro-batch count, full recompute or not), kept for the whole search: they depend on nothing
 * else of a search's layouts (not on dp, tp, cp, ep, sp or the ZeRO stage), and building them
 * (zb and dualpipe(v) simulate every rank's micro-batches) is most of what the memory plan
 * costs. An open-addressing table, grown at half full. */
typedef struct {
    int used, kind, pp, vpp, m, full;
    int (*slots)[MODEL_MAX_CHUNKS], *zb; /* pp of each */
} rank_sets;

typedef struct {
    rank_sets *e;
    long cap, n;
} sets_cache;

static unsigned long sets_hash(int kind, int pp, int vpp, int m, int full, long cap) {
    unsigned long h = 1469598103934665603UL;
    int k[] = {kind, pp, vpp, m, full};
    for (int i = 0; i < 5; i++) h = (h ^ (unsigned)k[i]) * 1099511628211UL;
    return h % (unsigned long)cap;
}

static rank_sets *sets_slot(sets_cache *sc, int kind, int pp, int vpp, int m, int full) {
    unsigned long i = sets_hash(kind, pp, vpp, m, full, sc->cap);
    for (rank_sets *x = &sc->e[i]; x->used; i = (i + 1) % sc->cap, x = &sc->e[i])
        if (x->kind == kind && x->pp == pp && x->vpp == vpp && x->m == m && x->full == full)
            return x;
    return &sc->e[i];
}

static void sets_grow(sets_cache *sc) {
    sets_cache g = {.cap = sc->cap ? 2 * sc->cap : 256, .n = sc->n};
    g.e = calloc(g.cap, sizeof *g.e);
    if (!g.e) abort();
    for (long i = 0; i < sc->cap; i++)
        if (sc->e[i].used) {
            const rank_sets *x = &sc->e[i];
            *sets_slot(&g, x->kind, x->pp, x->vpp, x->m, x->full) = *x;
        }
    free(sc->e);
    *sc = g;
}

/* The sets of c's pipeline, built on first use. */
static const rank_sets *sets_of(sets_cache *sc, const ust_config *c) {
    int pp = c->parallel.pp, kind = c->parallel.pp_schedule, vpp = c->parallel.vpp;
    int m = cfg_grad_accum(c), full = c->train.recompute == RECOMPUTE_FULL;
    if (2 * (sc->n + 1) > sc->cap) sets_grow(sc);
    rank_sets *x = sets_slot(sc, kind, pp, vpp, m, full);
    if (x->used) return x;
    *x = (rank_sets){
        1, kind, pp, vpp, m, full, calloc(pp, sizeof *x->slots), calloc(pp, sizeof *x->zb)};
    if (!x->slots || !x->zb) abort();
    plan_activation_sets(c, x->slots, x->zb);
    sc->n++;
    return x;
}

static void sets_free(sets_cache *sc) {
    for (long i = 0; i < sc->cap; i++) free(sc->e[i].slots), free(sc->e[i].zb);
    free(sc->e);
}

/* mem and mem_peak: plan_memory and plan_memory_peak, from the cache's sets when given */
static void memory(const ust_config *c, sets_cache *cache, planner_cost *o) {
    mem_plan mp;
    if (!cache) {
        plan_memory(c, &mp);
        o->mem = mp.total;
        o->mem_peak = plan_memory_peak(c);
        return;
    }
    const rank_sets *sets = sets_of(cache, c);
    /* each pipeline rank once, without the whole model's tensor list (n_params, which the
     * estimate does not read): rank 0's total is plan_memory's, the largest the peak */
    o->mem = o->mem_peak = 0;
    for (int r = 0; r < c->parallel.pp; r++) {
        plan_memory_rank_sets(c, r, 0, sets->slots[r], sets->zb[r], &mp);
        if (r == 0) o->mem = mp.total;
        if (mp.total > o->mem_peak) o->mem_peak = mp.total;
    }
}

static void estimate(const ust_config *c, const planner_hw *hw, planner_cost *o, sets_cache *sets);

void planner_estimate(const ust_config *c, const planner_hw *hw, planner_cost *o) {
    estimate(c, hw, o, NULL);
}

/* What every part of one estimate reads: the layout, the shapes, this rank's share of the layers
 * and each group's bandwidth. */
typedef struct {
    const ust_config *c;
    const planner_hw *hw;
    int dp, tp, pp, v, cp, ep, m, full, sp, dual, both_ends;
    ust_pp_schedule kind;
    double B, T, C, L, Tl, A, layers, moe_on, dense_on, copies;
    double slowest; /* the slowest pp rank's layer work over the mean rank's (1: balanced) */
    planner_sizes s;
    double bw[PLAN_NGROUPS];
} est_in;

/* Dense and MoE layers per pp rank (a mixed model: moe.first_dense, moe.layers): the rank
 * holding the most MoE layers sets moe_on (its memory and expert traffic are what the layout
 * must fit), and the slowest rank's layer FLOPs over the mean rank's stretch the compute (a
 * pipeline runs at its slowest stage). Stage s is on rank s % pp, dualpipev's second half
 * mirrored (2pp-1-s); dualpipe's rank r holds stages r and pp-1-r (one copy each). The last
 * stage also runs model.mtp's modules. */
static void est_stage_moe(est_in *e) {
    const ust_config *c = e->c;
    int p = e->pp, S = cfg_pp_stages(c), L = c->model.n_layer, D = c->model.mtp.depth;
    /* a layer's work in FLOPs / 6: its matmul parameters (attention with its MLP or its MoE's
     * active experts), its scores and weighted sum over its keys (model_attention_flops) */
    double fm = e->s.attn + (e->s.n_moe ? e->s.mm_moe / e->s.n_moe : 0);
    double moe[p], w[p], work = 0, top = 0;
    memset(moe, 0, sizeof moe), memset(w, 0, sizeof w);
    for (int st = 0; st < S; st++) {
        int lo, hi, r = e->kind == PP_DUALPIPEV && st >= p ? 2 * p - 1 - st : st % p;
        cfg_stage_layers(c, st, &lo, &hi);
        if (st == S - 1) hi += D; /* layers L.. are the modules' blocks */
        for (int l = lo; l < hi; l++)
            for (int twice = 0; twice <= e->dual; twice++) {
                int rr = twice ? p - 1 - r : r, m = l < L && cfg_layer_is_moe(c, l);
                double f = l >= L ? e->s.mm_mtp / D : m ? fm : e->s.attn + e->s.mlp;
                moe[rr] += m / e->copies;
                w[rr] += (f + model_attention_flops(c, l, (int)e->T) / 6) / e->copies;
            }
    }
    e->moe_on = 0, e->slowest = 1;
    for (int r = 0; r < p; r++) {
        work += w[r] / p, top = w[r] > top ? w[r] : top;
        if (moe[r] > e->moe_on) e->moe_on = moe[r];
    }
    if (work > 0) e->slowest = top / work;
    e->dense_on = e->layers > e->moe_on ? e->layers - e->moe_on : 0;
}

static void est_setup(const ust_config *c, const planner_hw *hw, est_in *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    *e = (est_in){.c = c,
                  .hw = hw,
                  .dp = p->dp,
                  .tp = p->tp,
                  .pp = p->pp,
                  .v = p->vpp,
                  .cp = p->cp,
                  .ep = p->ep,
                  .m = cfg_grad_accum(c)};
    e->full = c->train.recompute == RECOMPUTE_FULL, e->sp = p->sp && e->tp > 1;
    e->B = c->train.micro_batch_size, e->T = c->train.seq_len, e->C = c->model.d_model;
    e->L = c->model.n_layer, e->Tl = e->T / e->cp, e->A = cfg_act_size(c);
    planner_model_sizes(c, &e->s);
    e->layers = e->L / e->pp;
    /* dualpipe: rank r holds stage r for the micro-batches entering at rank 0 and stage pp-1-r
     * for those entering at pp-1, i.e. two copies of a 1f1b rank's layers (the pair r, pp-1-r
     * holds the same two); each micro-batch still visits every rank once, so compute and p2p
     * are a 1f1b rank's. dualpipev's two chunks are the V's stages r and 2pp-1-r, so rank 0 holds
     * both the embedding and the head, as both ends of dualpipe do. */
    e->kind = e->pp > 1 ? p->pp_schedule : PP_1F1B;
    e->dual = e->kind == PP_DUALPIPE, e->both_ends = e->dual || e->kind == PP_DUALPIPEV;
    e->copies = e->dual ? 2 : 1;
    est_stage_moe(e);
}

/* compute: the dense part is split over tp, the MoE MLPs' tokens too (each tp rank routes
 * its 1/tp of them); every token of the step goes through once (dp x cp split the tokens, pp
 * the layers); full recompute runs the forward (a third of the work) twice */
static void est_compute(const est_in *e, planner_cost *o) {
    double attn = attention_flops(e->c); /* every layer's keys, a window's where shorter */
    double f_dense = 6 * e->s.mm_dense + attn, f_moe = 6 * e->s.mm_moe;
    if (e->full) f_dense += 2 * e->s.mm_dense + attn / 3, f_moe += 2 * e->s.mm_moe;
    double tokens = (double)e->c->train.global_batch_size * e->T;
    double flops = tokens / ((double)e->dp * e->cp) * (f_dense + f_moe) / ((double)e->tp * e->pp);
    o->compute = e->slowest * flops / (e->hw->mfu * e->hw->peak_flops);
    /* the schedule's published bubble (pp_schedule.h), with the planner's F : B : W = 1 : 1 : 1
     * (a whole backward costs two forwards) */
    pps_costs fbw = {.f = 1, .b = 1, .w = 1};
    o->bubble =
        e->pp > 1 ? pps_analytic_bubble(e->kind, e->pp, e->v, e->m, fbw, NULL) * o->compute : 0;
}

/* which bandwidth each group gets: rank order tp, cp, dp, pp (fastest first) */
static void est_links(est_in *e, planner_cost *o) {
    int gpn = e->hw->gpus_per_node, tp = e->tp, cp = e->cp;
    o->intra[PLAN_TP] = planner_intra_node(1, tp, gpn);
    o->intra[PLAN_CP] = planner_intra_node(tp, cp, gpn);
    o->intra[PLAN_DP] = planner_intra_node(tp, cp * e->dp, gpn); /* dp x cp, expert-dp x cp */
    o->intra[PLAN_EP] = planner_intra_node(tp * cp, e->ep, gpn);
    o->intra[PLAN_PP] = planner_intra_node(tp * cp * e->dp, e->pp, gpn);
    for (int g = 0; g < PLAN_NGROUPS; g++)
        e->bw[g] = o->intra[g] ? e->hw->bw_intra : e->hw->bw_inter;
}

/* DP: this rank's parameters (the heavier end stage under a pipeline; both copies under
 * dualpipe, whose gradient buffer holds them); *dense and *experts are those counts */
static void est_dp(const est_in *e, planner_cost *o, double *dense, double *experts) {
    const planner_sizes *s = &e->s;
    double end =
        e->pp > 1 && !e->both_ends ? (s->emb > s->head ? s->emb : s->head) : s->emb + s->head;
    *dense = (e->copies * (e->layers * s->attn + e->dense_on * s->mlp) + end) / e->tp +
             e->copies * e->moe_on * s->moe_dense;
    *experts = e->copies * e->moe_on * ((double)e->c->model.moe.num_experts / e->ep) * s->expert;
    int zero = e->c->optimizer.zero_stage;
    o->group[PLAN_DP] = dp_time(*dense, e->dp * e->cp, e->bw[PLAN_DP], zero, e->m) +
                        dp_time(*experts, e->dp / e->ep * e->cp, e->bw[PLAN_DP], zero, e->m);
}

/* TP, per micro-batch, in units of one all-gather of the rows a = (B, T/cp, C): a dense layer
 * all-reduces twice forward and twice backward (8 units); with sp it all-gathers and
 * reduce-scatters instead and gathers both norms' outputs again in backward (10). A MoE
 * layer has attention's (4; sp: 5) and, without sp, the all-gathers of its tp parts' output
 * and input gradient (2); each micro-batch then all-reduces the layer's gradients over tp
 * (its tokens were split). Full recompute repeats the forward's (4, 4; MoE 3, 2).
 * Embedding and lm_head: 4. */
static void est_tp(const est_in *e, planner_cost *o) {
    const __typeof__(e->c->model.moe) *moe = &e->c->model.moe;
    int tp = e->tp, sp = e->sp, full = e->full;
    double unit = planner_allgather_s(e->A * e->B * e->Tl * e->C, tp, e->bw[PLAN_TP]);
    double u_dense = (sp ? 10 : 8) + full * 4, u_moe = (sp ? 5 : 6) + full * (sp ? 2 : 3);
    double moe_grads = moe->num_experts / e->ep * e->s.expert + e->s.moe_dense; /* + router */
    double moe_reduce = tp > 1 ? 2 * planner_allgather_s(4 * moe_grads, tp, e->bw[PLAN_TP]) : 0;
    o->group[PLAN_TP] =
        e->m * ((e->dense_on * u_dense + e->moe_on * u_moe + 4) * unit + e->moe_on * moe_reduce);
}

/* CP ring: each key/value block travels only as far as the last rank whose queries see it,
 * forward and again in backward, where their gradients travel with them and go home from that
 * rank; once more forward under full recompute (planner_cp.h: with every block needed everywhere
 * that is n-1 hops forward, n-1 back and n for the gradients, 3n - 2 blocks a layer). The ring's
 * time is its busiest rank's sends. The allgather variant gathers K/V forward and backward
 * and reduce-scatters their gradients: 3 (n-1) blocks (4 under full recompute). Ulysses over a
 * ranks (a2a: a = cp; a2a+ring: parallel.cp_a2a, the ring then runs over cp/a blocks of a*Tl
 * tokens of H/a heads): per layer each rank sends (a-1) parts of B*Tl*D per head: forward q, k,
 * v there and out back (2 Hq + 2 Hk heads), backward q, k, v, out, d out there and dq, dk, dv
 * back (4 Hq + 4 Hk), with Hq = H/a, Hk = Hkv/a (1 when a key/value head is replicated); cp.h
 * cp_a2a_layer_bytes, which the traffic test checks against the counters. Both stages at
 * the cp group's bandwidth, over every attention layer (model.mtp's blocks too) of a mean stage
 * (model.mtp's one-token halo is not counted); cp_group: what the group's ranks send together
 * (the metric comm_bytes_cp_group). */
static void est_cp(const est_in *e, planner_cost *o) {
    const ust_config *c = e->c;
    int cp = e->cp, tp = e->tp, full = e->full;
    if (cp == 1) return;
    double A = e->A, B = e->B, Tl = e->Tl;
    int a = cfg_cp_a2a(c), ring = cp / a;
    double D = cfg_head_dim(c), H = c->model.n_head / tp, Hkv = c->model.n_kv_head / tp;
    double Hq = H / a, Hk = a == 1 ? Hkv : ((int)Hkv % a == 0 ? Hkv / a : 1);
    double kv = A * B * Tl * a * 2.0 * Hk * D; /* one ring block */
    double layers = (double)e->L + c->model.mtp.depth;
    /* latent attention's latent ring (cfg_cp_latent; docs/deepseek.md): a block is B Tl
     * (kv_lora_rank + qk_rope_head_dim) values, on the same routes (planner_ring_sends) */
    if (cfg_cp_latent(c)) kv = A * B * Tl * cfg_cp_latent(c);
    planner_ring rs = {0};
    if (ring > 1 && c->parallel.cp_comm == CP_ALLGATHER)
        rs.busiest = layers * (3 + full) * (ring - 1.0), rs.group = ring * rs.busiest;
    else if (ring > 1)
        planner_ring_sends(c, ring, a, &rs);
    double u = (a - 1) * A * B * Tl * D, ulysses = u * (6 * Hq + 6 * Hk + full * (2 * Hq + 2 * Hk));
    /* Ulysses also gathers each micro-batch's query starts once per stage: the documents' and
     * each window's (int32, as fp32; model.c take_batch) */
    int w[CFG_MAX_WINDOWS], starts = cfg_windows(c, w) + (c->data.doc_mask || c->data.packing ||
                                                          c->train.seq_len_warmup.start > 0);
    double gather = a > 1 ? starts * (a - 1) * B * Tl * 4.0 : 0;
    double per = e->m / (double)e->pp; /* micro-batches over a mean stage's share of the layers */
    o->group[PLAN_CP] =
        (per * (rs.busiest * kv + layers * ulysses) + e->m * gather) / e->bw[PLAN_CP];
    o->cp_group = per * (a * rs.group * kv + cp * layers * ulysses) + e->m * cp * gather;
}

/* PP: each micro-batch crosses every chunk boundary forward (activations) and backward
 * (their gradients), v chunks per rank but dualpipe's one (a micro-batch uses one of the
 * rank's two copies); under sp the residual stream is split over tp. dualpipe then sums the
 * two copies' gradients over the mirror pair r, pp-1-r after every step: one all-reduce of
 * this rank's fp32 gradients (both copies) over 2 ranks, inside the pp group.
 * EP: every token (each on one tp rank) goes to its top_k experts and back, forward and
 * backward: four all-to-alls per MoE layer, two more under full recompute */
static void est_pp_ep(const est_in *e, planner_cost *o, double dense, double experts) {
    double act = e->A * e->B * e->Tl * e->C / (e->sp ? e->tp : 1);
    o->group[PLAN_PP] = e->pp > 1 ? 2.0 * (e->dual ? 1 : e->v) * e->m * act / e->bw[PLAN_PP] : 0;
    if (e->dual)
        o->group[PLAN_PP] += planner_allreduce_s(BYTES * (dense + experts), 2, e->bw[PLAN_PP]);
    double rows = e->B * e->Tl * e->c->model.moe.top_k / e->tp;
    o->group[PLAN_EP] = e->m * e->moe_on * (4 + 2 * e->full) *
                        planner_alltoall_s(e->A * rows * e->C, e->ep, e->bw[PLAN_EP]);
    /* the ep members of one node (ranks numbered node after node, tp x cp apart): a copy goes
     * to each member alike whatever the routing (node-limited routing bounds the nodes a token
     * reaches, not its copies, which the all-to-all sends one by one), so the share of the sent
     * bytes that leaves the node is (ep - q) / (ep - 1) */
    int per_node = e->hw->gpus_per_node / (e->tp * e->cp), q = per_node < 1 ? 1 : per_node;
    o->ep_inter = 0;
    if (e->ep > 1 && !o->intra[PLAN_EP])
        o->ep_inter =
            (e->ep - (q < e->ep ? q : e->ep)) / (e->ep - 1.0) * o->group[PLAN_EP] * e->bw[PLAN_EP];
}

static void estimate(const ust_config *c, const planner_hw *hw, planner_cost *o, sets_cache *sets) {
    est_in e;
    double dense, experts;
    est_setup(c, hw, &e);
    memset(o, 0, sizeof *o);
    est_compute(&e, o);
    est_links(&e, o);
    est_dp(&e, o, &dense, &experts);
    est_tp(&e, o);
    est_cp(&e, o);
    est_pp_ep(&e, o, dense, experts);
    for (int g = 0; g < PLAN_NGROUPS; g++) {
        o->comm += o->group[g];
        o->sent[g] = o->group[g] * e.bw[g]; /* every time above is bytes sent / bw */
    }
    o->total = o->compute + o->bubble + o->comm;
    o->tokens_per_s = (double)c->train.global_batch_size * e.T / o->total;
    memory(c, sets, o);
}

/* ---------------------------------------------------------------- the search */

static int cmp3(double a, double b) { return a < b ? -1 : a > b; }

int planner_compare(const void *pa, const void *pb) {
    const planner_entry *a = pa, *b = pb;
    int r;
    /* step times compared at float precision, so sums of the same terms in another order tie
     * (rounding to float keeps the order a strict weak order, which a tolerance would not) */
    if ((r = cmp3((float)a->cost.total, (float)b->cost.total))) return r;
    if ((r = cmp3(b->l.micro_batch, a->l.micro_batch))) return r;
    if ((r = cmp3(a->cost.mem_peak, b->cost.mem_peak))) return r;
    /* the schedule too: interleaved, dualpipev and dualpipe share a mesh at vpp 2 and may tie */
    int x[] = {a->l.dp, a->l.tp, a->l.pp, a->l.vpp, a->l.cp, a->l.ep, a->l.zero, a->l.schedule};
    int y[] = {b->l.dp, b->l.tp, b->l.pp, b->l.vpp, b->l.cp, b->l.ep, b->l.zero, b->l.schedule};
    for (int i = 0; i < 8; i++)
        if ((r = cmp3(x[i], y[i]))) return r;
    if ((r = cmp3(a->l.sp, b->l.sp))) return r;
    return cmp3(a->l.recompute, b->l.recompute);
}

static int divisors(int n, int *d, int max) {
    int k = 0;
    for (int i = 1; i <= n && k < max; i++)
        if (n % i == 0) d[k++] = i;
    return k;
}

typedef struct {
    const ust_config *base;
    const planner_hw *hw;
    int world;
    planner_entry *e;
    long n, cap;
    planner_stats *st;
    double smallest;
    sets_cache sets;
} search;

/* zb and dualpipe(v) win back at most 1f1b's bubble, (pp - 1) / m of the step, and their memory
 * plan simulates every rank's m micro-batches (seconds at thousands of them): past m =
 * DEEP_M x pp, where that bubble is under 1/DEEP_M, the search leaves them out. (The cache of
 * sets_of does not make this cut-off unnecessary: without it plan --world 16 of
 * configs/deepseek-v3.yaml did not finish in 10 minutes.) */
enum { DEEP_M = 32 };

static int deep_pipeline(const ust_config *base, const planner_layout *l) {
    ust_pp_schedule k = l->schedule;
    long long m = base->train.global_batch_size / ((long long)l->dp * l->micro_batch);
    return l->pp > 1 && (k == PP_ZB || k == PP_DUALPIPE || k == PP_DUALPIPEV) &&
           m > (long long)DEEP_M * l->pp;
}

static void consider(search *s, const planner_layout *l) {
    ust_config c;
    ust_err err;
    if (deep_pipeline(s->base, l)) return;
    planner_apply(s->base, l, &c);
    s->st->candidates++;
    if (cfg_validate(&c, s->world, &err)) {
        if (!s->st->invalid++)
            snprintf(s->st->first_error, sizeof s->st->first_error, "%s", err.msg);
        return;
    }
    planner_entry e = {.l = *l};
    estimate(&c, s->hw, &e.cost, &s->sets);
    if (s->smallest == 0 || e.cost.mem_peak < s->smallest)
        s->smallest = e.cost.mem_peak, s->st->smallest = e;
    if (e.cost.mem_peak > s->hw->gpu_mem) {
        s->st->over_mem++;
        return;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->e = realloc(s->e, s->cap * sizeof *s->e);
        if (!s->e) abort();
    }
    s->e[s->n++] = e;
}

/* The parts of a layout below the mesh: sp, ZeRO stage, recompute, micro-batch. */
static void sweep_mesh(search *s, planner_layout l) {
    int G = s->base->train.global_batch_size, mbs[64];
    if (G % l.dp) { /* cfg_validate says why */
        l.micro_batch = 1, l.zero = 0, l.sp = 0, l.recompute = RECOMPUTE_NONE;
        consider(s, &l);
        return;
    }
    int nm = divisors(G / l.dp, mbs, 64);
    for (int sp = 0; sp <= (l.tp > 1); sp++)
        for (int z = 0; z <= 3; z++)
            for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++)
                for (int i = 0; i < nm; i++) {
                    l.sp = sp, l.zero = z, l.recompute = (ust_recompute)r, l.micro_batch = mbs[i];
                    consider(s, &l);
                }
}

/* The schedules tried at pp > 1 and the vpp each runs at (0: every vpp 2..16 the layers divide
 * into). afab is left out: 1f1b has its bubble while holding at most pp micro-batches' activations
 * instead of all m, so afab never ranks above it. The rest trade bubble for memory or
 * communication in ways only the estimate and the memory plan can weigh: zb defers weight
 * gradients into the bubble, dualpipev folds the pipeline into a V (2 chunks), dualpipe runs it
 * from both ends at the price of two copies of the parameters and a mirror all-reduce. What a
 * schedule cannot run (MoE under zb, too few micro-batches, ...) cfg_validate refuses. */
static const struct {
    ust_pp_schedule kind;
    int vpp;
} SCHEDULES[] = {
    {PP_1F1B, 1}, {PP_INTERLEAVED, 0}, {PP_ZB, 1}, {PP_DUALPIPEV, 2}, {PP_DUALPIPE, 2}};

/* Every schedule and vpp of one (dp, tp, pp, cp, ep) mesh whose stages divide the layers. */
static void sweep_schedules(search *s, planner_layout l) {
    int L = s->base->model.n_layer;
    if (l.pp == 1) { /* one stage: the schedule is irrelevant, try it once */
        l.vpp = 1, l.schedule = PP_1F1B;
        sweep_mesh(s, l);
        return;
    }
    for (size_t k = 0; k < sizeof SCHEDULES / sizeof *SCHEDULES; k++) {
        ust_pp_schedule kind = SCHEDULES[k].kind;
        if (kind == PP_DUALPIPE && l.pp % 2) continue; /* its ranks pair up, r with pp-1-r */
        int lo = SCHEDULES[k].vpp ? SCHEDULES[k].vpp : 2, hi = SCHEDULES[k].vpp ? lo : 16;
        for (int v = lo; v <= hi; v++) {
            /* dualpipe's pp stages each appear twice, one copy per direction; the stages need
             * a layer each, and interleaving's vpp an even split (each vpp one more search) */
            int S = kind == PP_DUALPIPE ? l.pp : l.pp * v;
            if (S > L || (kind == PP_INTERLEAVED && L % S)) continue;
            l.vpp = v, l.schedule = kind;
            sweep_mesh(s, l);
        }
    }
}

long planner_search(const ust_config *base, int world, const planner_hw *hw, planner_entry **out,
                    planner_stats *st) {
    search s = {.base = base, .hw = hw, .world = world, .st = st};
    memset(st, 0, sizeof *st);
    int d[256], nd = divisors(world, d, 256), E = base->model.moe.num_experts;
    progress pr;
    progress_begin(&pr, "plan: searching layouts", (double)nd * nd, false);
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nd; b++, progress_add(&pr, 1))
            for (int q = 0; q < nd; q++) {
                int tp = d[a], cp = d[b], pp = d[q];
                if (world % ((long)tp * cp * pp)) continue;
                int dp = world / (tp * cp * pp);
                for (int ep = 1; ep <= dp; ep++) {
                    if (dp % ep || (ep > 1 && (E == 0 || E % ep))) continue;
                    planner_layout l = {.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = ep};
                    sweep_schedules(&s, l);
                }
            }
    progress_end(&pr);
    sets_free(&s.sets);
    if (s.n) qsort(s.e, s.n, sizeof *s.e, planner_compare); /* qsort(NULL, 0) is undefined */
    st->fitting = s.n;
    *out = s.e;
    return s.n;
}

/* The schedule is not part of the mesh: like the ZeRO stage, micro-batch and recompute it changes
 * neither the rank grid nor the process groups, only how the pipeline ranks order their work, so
 * it is a variant of the mesh and the best one wins (--all lists the others). */
long planner_best_per_mesh(planner_entry *e, long n) {
    long k = 0;
    for (long i = 0; i < n; i++) {
        int seen = 0;
        for (long j = 0; j < k && !seen; j++)
            seen = e[j].l.dp == e[i].l.dp && e[j].l.tp == e[i].l.tp && e[j].l.pp == e[i].l.pp &&
                   e[j].l.vpp == e[i].l.vpp && e[j].l.cp == e[i].l.cp && e[j].l.ep == e[i].l.ep;
        if (!seen) e[k++] = e[i];
    }
    return k;
}
