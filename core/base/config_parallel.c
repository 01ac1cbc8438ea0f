/* config_parallel: the parallel layout's rules, one function per dimension or rule group, in
 * the order of the checks (the first rule broken is the one reported), and the pipeline stages'
 * layers and the Ulysses degree derived from it. */
#include "config_internal.h"

#include <stdlib.h>
#include <string.h>

/* tp: the heads and the padded vocabulary split over the tensor-parallel ranks */
static int cfg_check_tp(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    const __typeof__(c->model) *m = &c->model;
    REQUIRE(m->n_head % p->tp == 0, "model.n_head (%d) must be divisible by parallel.tp (%d)",
            m->n_head, p->tp);
    REQUIRE(m->n_kv_head % p->tp == 0, "model.n_kv_head (%d) must be divisible by parallel.tp (%d)",
            m->n_kv_head, p->tp);
    REQUIRE(cfg_vocab_padded(c) % p->tp == 0,
            "the padded vocab (%d: model.vocab_size %d rounded up to a multiple of model.vocab_pad "
            "%d) must be divisible by parallel.tp (%d)",
            cfg_vocab_padded(c), m->vocab_size, m->vocab_pad, p->tp);
    return 0;
}

/* pp: each stage's layers, listed (parallel.pp_layers) or an even split */
static int cfg_check_pp_layers(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    const __typeof__(c->model) *m = &c->model;
    long long stages = cfg_pp_stages(c);
    if (p->pp_layers[0]) {
        int per[CFG_MAX_STAGES], n = cfg_pp_layers(c, per), sum = 0;
        for (int i = 0; i < n; i++) sum += per[i];
        REQUIRE(
            n == stages, "parallel.pp_layers has %d entries; it needs one per stage: %s = %lld", n,
            p->pp_schedule == PP_DUALPIPE ? "parallel.pp (dualpipe)" : "parallel.pp * parallel.vpp",
            stages);
        REQUIRE(sum == m->n_layer, "parallel.pp_layers adds up to %d layers; model.n_layer is %d",
                sum, m->n_layer);
    }
    REQUIRE(p->pp_layers[0] || p->pp_schedule != PP_DUALPIPE || m->n_layer % p->pp == 0,
            "model.n_layer (%d) must be divisible by parallel.pp (%d): dualpipe splits the model "
            "into pp stages (each rank holds two of them), or parallel.pp_layers must list each "
            "stage's layers",
            m->n_layer, p->pp);
    REQUIRE(p->pp_layers[0] || p->pp_schedule == PP_DUALPIPE || m->n_layer % stages == 0,
            "model.n_layer (%d) must be divisible by parallel.pp * parallel.vpp (%d * %d = %lld), "
            "or parallel.pp_layers must list each stage's layers",
            m->n_layer, p->pp, p->vpp, stages);
    return 0;
}

cfg_pp_rule cfg_pp_shape(ust_pp_schedule kind, int p, int v, long long m) {
    int dpv = kind == PP_DUALPIPEV, dp = kind == PP_DUALPIPE;
    if (v != 1 && kind != PP_INTERLEAVED && !dpv && !dp) return CFG_PP_VPP_SCHEDULE;
    /* dualpipev: rank r holds stages r and 2p-1-r, so the stages (and pp_layers' entries) are
     * pp * 2; vpp says so explicitly rather than changing meaning behind the user's back */
    if (dpv && p < 2) return CFG_PP_DPV_PP;
    if (dpv && v != 2) return CFG_PP_DPV_VPP;
    /* dualpipe: rank r holds stage r for the micro-batches entering at rank 0 and stage pp-1-r
     * for those entering at rank pp-1: two chunks again, vpp 2, and the ranks pair up */
    if (dp && (p < 2 || p % 2)) return CFG_PP_DP_PP;
    if (dp && v != 2) return CFG_PP_DP_VPP;
    if (m < 0) return CFG_PP_OK;
    if (dpv && m < 2LL * p) return CFG_PP_DPV_MB;
    if (dp && (m < 2LL * p || m % 2)) return CFG_PP_DP_MB; /* half enter from each end */
    if (kind == PP_INTERLEAVED && p > 1 && m % p) return CFG_PP_INTERLEAVED_MB;
    return CFG_PP_OK;
}

static bool dual_schedule(const ust_config *c) {
    return c->parallel.pp_schedule == PP_DUALPIPE || c->parallel.pp_schedule == PP_DUALPIPEV;
}

void cfg_apply_implied(ust_config *c) {
    if (!cfg_was_set(c, "parallel.vpp")) c->parallel.vpp = dual_schedule(c) ? 2 : 1;
}

bool cfg_vpp_implied(const ust_config *c) {
    return dual_schedule(c) && !cfg_was_set(c, "parallel.vpp");
}

const char *cfg_pp_rule_text(cfg_pp_rule r) {
    static const char *text[] = {
        [CFG_PP_OK] = "",
        [CFG_PP_VPP_SCHEDULE] = "vpp > 1 needs pp_schedule: interleaved, dualpipev or dualpipe",
        [CFG_PP_DPV_PP] = "dualpipev needs pp >= 2",
        [CFG_PP_DPV_VPP] = "dualpipev needs vpp = 2",
        [CFG_PP_DP_PP] = "dualpipe needs an even pp >= 2",
        [CFG_PP_DP_VPP] = "dualpipe needs vpp = 2",
        [CFG_PP_DPV_MB] = "dualpipev needs at least 2 * pp micro-batches",
        [CFG_PP_DP_MB] = "dualpipe needs an even number of at least 2 * pp micro-batches",
        [CFG_PP_INTERLEAVED_MB] = "interleaved needs a multiple of pp micro-batches"};
    return text[r];
}

/* pp: the schedule against parallel.pp and parallel.vpp (cfg_pp_shape's rules, said in the
 * config's keys), and zb against MoE layers */
static int cfg_check_pp_schedule(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    const __typeof__(c->model) *m = &c->model;
    const char *kind = cfg_pp_schedule_names[p->pp_schedule];
    switch (cfg_pp_shape(p->pp_schedule, p->pp, p->vpp, -1)) {
    case CFG_PP_VPP_SCHEDULE:
        return cfg_vfail(c, e,
                         "parallel.vpp (%d) > 1 needs parallel.pp_schedule: interleaved (got %s)",
                         p->vpp, kind);
    case CFG_PP_DPV_PP:
        return cfg_vfail(c, e, "parallel.pp_schedule: dualpipev needs parallel.pp > 1 (got %d)",
                         p->pp);
    case CFG_PP_DPV_VPP:
        return cfg_vfail(
            c, e,
            "parallel.pp_schedule: dualpipev needs parallel.vpp: 2 (got %d): each "
            "rank holds two stages of the V, r and 2*pp-1-r (leave parallel.vpp out: it is "
            "then 2)",
            p->vpp);
    case CFG_PP_DP_PP:
        return cfg_vfail(c, e,
                         "parallel.pp_schedule: dualpipe needs an even parallel.pp >= 2 (got %d): "
                         "rank r and rank pp-1-r hold the same two stages, for the two directions",
                         p->pp);
    case CFG_PP_DP_VPP:
        return cfg_vfail(c, e,
                         "parallel.pp_schedule: dualpipe needs parallel.vpp: 2 (got %d): each rank "
                         "holds two stages, r for one direction and pp-1-r for the other (leave "
                         "parallel.vpp out: it is then 2)",
                         p->vpp);
    default:
        break;
    }
    /* the schedule builder runs one rank's chunks too (its tests do); a run has no use for it */
    REQUIRE(p->vpp == 1 || p->pp > 1,
            "parallel.vpp (%d) > 1 needs parallel.pp > 1: virtual stages interleave over pipeline "
            "ranks",
            p->vpp);
    REQUIRE(p->vpp <= 16, "parallel.vpp (%d) must be at most 16", p->vpp);
    REQUIRE(p->pp == 1 || p->pp_schedule != PP_ZB || m->moe.num_experts == 0,
            "parallel.pp_schedule: zb does not split a MoE layer's backward into B and W; use "
            "1f1b or interleaved with model.moe.num_experts = %d",
            m->moe.num_experts);
    return 0;
}

/* the micro-batches: their tokens split over tp in the MoE layers, and how many a step has
 * against what the pipeline schedule needs (cfg_pp_shape's rules) */
static int cfg_check_micro_batches(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    const __typeof__(c->model) *m = &c->model;
    long long moe_tokens =
        (long long)c->train.micro_batch_size * c->train.seq_len / (p->cp > 0 ? p->cp : 1);
    REQUIRE(m->moe.num_experts == 0 || moe_tokens % p->tp == 0,
            "the MoE layers split each micro-batch's tokens over parallel.tp: "
            "train.micro_batch_size * train.seq_len / parallel.cp (%lld) must be divisible by "
            "parallel.tp (%d)",
            moe_tokens, p->tp);
    long long per_dp = (long long)c->train.micro_batch_size * p->dp;
    long long mbs = per_dp > 0 ? c->train.global_batch_size / per_dp : 0;
    int G = c->train.global_batch_size, B = c->train.micro_batch_size;
    switch (cfg_pp_shape(p->pp_schedule, p->pp, p->vpp, mbs)) {
    case CFG_PP_INTERLEAVED_MB:
        return cfg_vfail(c, e,
                         "parallel.pp_schedule: interleaved needs the micro-batches per step (%lld "
                         "= train.global_batch_size %d / (micro_batch_size %d x dp %d)) to be a "
                         "multiple of parallel.pp (%d)",
                         mbs, G, B, p->dp, p->pp);
    case CFG_PP_DPV_MB:
        return cfg_vfail(c, e,
                         "parallel.pp_schedule: dualpipev needs at least 2 * parallel.pp (%d) "
                         "micro-batches per step (got %lld = train.global_batch_size %d / "
                         "(micro_batch_size %d x dp %d))",
                         2 * p->pp, mbs, G, B, p->dp);
    case CFG_PP_DP_MB:
        return cfg_vfail(c, e,
                         "parallel.pp_schedule: dualpipe needs an even number of at least 2 * "
                         "parallel.pp (%d) micro-batches per step, half entering from each end "
                         "(got %lld = train.global_batch_size %d / (micro_batch_size %d x dp %d))",
                         2 * p->pp, mbs, G, B, p->dp);
    default:
        return 0;
    }
}

/* pp: the schedule against the optimizer's ZeRO stage and recomputation */
static int cfg_check_pp_training(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    /* rank 0 holds the embedding and the head; ZeRO-2/3 reduce unit 0's gradient (which the
     * tied head adds to) after each micro-batch's embedding backward, but dualpipev runs the
     * head's backward of later micro-batches in between */
    REQUIRE((p->pp_schedule != PP_DUALPIPEV && p->pp_schedule != PP_DUALPIPE) || !cfg_tied(c) ||
                c->optimizer.zero_stage <= 1,
            "parallel.pp_schedule: %s with tied embeddings needs optimizer.zero_stage <= 1 "
            "(got %d): rank 0 runs the head's backward of later micro-batches between a "
            "micro-batch's head and embedding backward",
            cfg_pp_schedule_names[p->pp_schedule], c->optimizer.zero_stage);
    REQUIRE(p->pp == 1 || p->pp_schedule != PP_ZB || c->train.recompute != RECOMPUTE_FULL,
            "parallel.pp_schedule: zb defers weight gradients, which full recomputation cannot "
            "keep; use train.recompute: none or selective%s",
            "");
    return 0;
}

/* cp: the sequence split, and the heads split by the all-to-all (Ulysses) variants */
static int cfg_check_cp(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    const __typeof__(c->model) *m = &c->model;
    REQUIRE(p->cp == 1 || c->train.seq_len % (2LL * p->cp) == 0,
            "train.seq_len (%d) must be divisible by 2 * parallel.cp (2 * %d = %lld): each rank "
            "holds two chunks of the sequence",
            c->train.seq_len, p->cp, 2LL * p->cp);
    REQUIRE(p->cp_comm == CP_A2A_RING || p->cp_a2a == 0,
            "parallel.cp_a2a (%d) is the Ulysses degree of parallel.cp_comm: a2a+ring (got %s)",
            p->cp_a2a, cfg_cp_comm_names[p->cp_comm]);
    REQUIRE(p->cp_comm != CP_A2A_RING ||
                (p->cp_a2a > 1 && p->cp_a2a < p->cp && p->cp % p->cp_a2a == 0),
            "parallel.cp_comm: a2a+ring needs parallel.cp_a2a (%d) between 2 and parallel.cp / 2 "
            "and dividing parallel.cp (%d): Ulysses over cp_a2a ranks, the ring across cp / cp_a2a "
            "groups",
            p->cp_a2a, p->cp);
    if (p->cp > 1 && (p->cp_comm == CP_A2A || p->cp_comm == CP_A2A_RING)) {
        int a = cfg_cp_a2a(c), h = m->n_head / p->tp, kv = m->n_kv_head / p->tp;
        REQUIRE(h % a == 0,
                "parallel.cp_comm: %s splits the attention heads over %d ranks, but this rank's "
                "heads (model.n_head %d / parallel.tp %d = %d) are not divisible by %d",
                cfg_cp_comm_names[p->cp_comm], a, m->n_head, p->tp, h, a);
        REQUIRE(kv % a == 0 || a % kv == 0,
                "parallel.cp_comm: %s needs this rank's key/value heads (model.n_kv_head %d / "
                "parallel.tp %d = %d) to divide by %d or to divide %d (then each is replicated "
                "over %d / %d ranks)",
                cfg_cp_comm_names[p->cp_comm], m->n_kv_head, p->tp, kv, a, a, a, kv);
    }
    return 0;
}

/* The checks in the order they always ran, so that the first rule a config breaks (the message
 * reported) does not depend on how they are grouped; ep's one rule last. */
int cfg_validate_parallel(const ust_config *c, ust_err *e) {
    if (cfg_check_tp(c, e) || cfg_check_pp_layers(c, e) || cfg_check_pp_schedule(c, e) ||
        cfg_check_micro_batches(c, e) || cfg_check_pp_training(c, e) || cfg_check_cp(c, e))
        return -1;
    const __typeof__(c->parallel) *p = &c->parallel;
    REQUIRE(p->dp % p->ep == 0,
            "parallel.dp (%d) must be divisible by parallel.ep (%d): expert-parallel groups are "
            "carved out of the data-parallel ranks",
            p->dp, p->ep);
    return 0;
}

int cfg_cp_a2a(const ust_config *c) {
    switch (c->parallel.cp_comm) {
    case CP_A2A:
        return c->parallel.cp;
    case CP_A2A_RING:
        return c->parallel.cp_a2a;
    default:
        return 1;
    }
}

int cfg_cp_latent(const ust_config *c) {
    const __typeof__(c->model.mla) *a = &c->model.mla;
    const __typeof__(c->parallel) *p = &c->parallel;
    ust_pp_schedule s = p->pp_schedule;
    /* a remote block's kv_b_proj weight gradient is added during backward, which zero-bubble's
     * and DualPipe's B leaves to W (docs/deepseek.md): those keep the K/V ring */
    int split = p->pp > 1 && (s == PP_ZB || s == PP_DUALPIPEV || s == PP_DUALPIPE);
    if (!a->enabled || !a->cp_latent || p->cp < 2 || split) return 0;
    if (p->cp_comm != CP_RING && p->cp_comm != CP_ALLGATHER) return 0;
    return a->kv_lora_rank + a->qk_rope_head_dim;
}

int cfg_pp_layers(const ust_config *c, int *per) {
    int n = 0;
    for (const char *q = c->parallel.pp_layers; *q && n < CFG_MAX_STAGES; n++) {
        per[n] = atoi(q);
        q = strchr(q, ',');
        if (!q) {
            n++;
            break;
        }
        q++;
    }
    return n;
}

int cfg_pp_stages(const ust_config *c) {
    return c->parallel.pp_schedule == PP_DUALPIPE && c->parallel.pp > 1
               ? c->parallel.pp
               : c->parallel.pp * c->parallel.vpp;
}

void cfg_stage_layers(const ust_config *c, int stage, int *lo, int *hi) {
    int S = cfg_pp_stages(c), per[CFG_MAX_STAGES];
    if (!c->parallel.pp_layers[0]) {
        *lo = stage * (c->model.n_layer / S);
        *hi = *lo + c->model.n_layer / S;
        return;
    }
    cfg_pp_layers(c, per);
    *lo = 0;
    for (int i = 0; i < stage; i++) *lo += per[i];
    *hi = *lo + per[stage];
}
