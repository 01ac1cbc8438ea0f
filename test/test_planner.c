/* test_planner: the cost model of `ustrain plan` against hand-computed cases (ring formulas, each
 * group's volume, compute, bubble), its parameter count against the memory plan's, and the
 * search's ranking in cases whose answer is known. The tiny model is the config defaults: llama,
 * L=4, d_model C=128, 4 heads of 32 (2 kv heads), d_ff 384, vocabulary 512, seq_len T=128. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "model.h"
#include "plan.h"
#include "planner.h"
#include "planner_cp.h"
#include "pp_schedule.h"
#include "test.h"

/* relative tolerance: the planner sums the same terms in another order */
#define RT 1e-12

static void tiny(ust_config *c) { cfg_defaults(c); }

static void moe(ust_config *c) {
    cfg_defaults(c);
    c->model.moe.num_experts = 4, c->model.moe.top_k = 2, c->model.moe.d_ff_expert = 64;
}

static planner_hw hw_of(double bw_intra, double bw_inter, int gpn) {
    planner_hw h;
    planner_hw_defaults(&h);
    h.peak_flops = 1e12, h.mfu = 0.5, h.bw_intra = bw_intra, h.bw_inter = bw_inter;
    h.gpus_per_node = gpn, h.gpu_mem = 1e18;
    return h;
}

/* c with the layout applied and its global batch set; fails the test if it is invalid */
static int layout(ust_config *out, const ust_config *base, planner_layout l, int G) {
    ust_config b = *base;
    b.train.global_batch_size = G;
    planner_apply(&b, &l, out);
    ust_err e;
    int world = l.dp * l.tp * l.pp * l.cp;
    if (cfg_validate(out, world, &e)) {
        printf("# invalid layout: %s\n", e.msg);
        return -1;
    }
    return 0;
}

/* LAYOUT(.tp = 2): a layout of ones (schedule 1f1b) with the named fields overridden (so
 * override-init is meant) */
#pragma GCC diagnostic ignored "-Woverride-init"
#define LAYOUT(...)                                                                                \
    ((planner_layout){.dp = 1,                                                                     \
                      .tp = 1,                                                                     \
                      .pp = 1,                                                                     \
                      .vpp = 1,                                                                    \
                      .cp = 1,                                                                     \
                      .ep = 1,                                                                     \
                      .micro_batch = 1,                                                            \
                      .schedule = PP_1F1B,                                                         \
                      __VA_ARGS__})

static void test_ring_formulas() {
    CHECK_CLOSE(planner_allreduce_s(1e9, 8, 1e9), 2.0 * 7 / 8, 0, RT, "all-reduce 2(n-1)/n");
    CHECK_CLOSE(planner_allgather_s(1e9, 8, 1e9), 7.0 / 8, 0, RT, "all-gather (n-1)/n");
    CHECK_CLOSE(planner_reducescatter_s(1e9, 4, 2e9), 3.0 / 8, 0, RT, "reduce-scatter");
    CHECK_CLOSE(planner_alltoall_s(1e9, 2, 1e9), 0.5, 0, RT, "all-to-all");
    CHECK(planner_allreduce_s(1e9, 1, 1e9) == 0, "a group of one communicates nothing");
}

static void test_group_is_intra_node_when_its_span_fits_and_divides_the_node() {
    CHECK(planner_intra_node(1, 8, 8), "tp 8 fills a node");
    CHECK(planner_intra_node(4, 2, 8), "cp 2 over tp 4 spans 8 ranks");
    CHECK(!planner_intra_node(4, 4, 8), "span 16 > 8");
    CHECK(!planner_intra_node(2, 3, 8), "span 6 does not divide 8: some groups straddle nodes");
    CHECK(!planner_intra_node(1, 2, 1), "one GPU per node: every group crosses nodes");
}

static void test_parameter_count_equals_the_memory_plans() {
    ust_config c, g, m, s;
    tiny(&c);
    planner_sizes z;
    planner_model_sizes(&c, &z);
    /* by hand: embedding 512*128, norm + lm_head 128 + 512*128, per layer 2 norms 256, q/o
     * 2*128*128, k/v 2*64*128, MLP 3*384*128 */
    CHECK_CLOSE(z.n_params, 65536 + 65664 + 4 * (256 + 32768 + 16384 + 147456), 0, 0, "llama");
    g = c, g.model.arch = ARCH_GPT2, g.model.n_kv_head = 4;
    moe(&m);
    s = m, s.model.moe.shared_expert = true, s.model.moe.every = 2, s.model.arch = ARCH_GPT2;
    s.model.n_kv_head = 4;
    ust_config d = m, q = m; /* DeepSeek's dense first layer, a wider shared expert; Qwen3's list */
    d.model.moe.first_dense = 1, d.model.d_ff = 96, d.model.moe.shared_expert = true;
    d.model.moe.shared_d_ff = 160;
    snprintf(q.model.moe.layers, sizeof q.model.moe.layers, "0,1,0,1");
    ust_config a = d, b = c; /* latent attention, with and without the q latent, over MoE */
    a.model.mla.enabled = true, a.model.mla.q_lora_rank = 24, a.model.mla.kv_lora_rank = 16;
    a.model.mla.qk_nope_head_dim = 12, a.model.mla.qk_rope_head_dim = 8;
    a.model.mla.v_head_dim = 16, a.model.n_kv_head = a.model.n_head, a.model.arch = ARCH_LLAMA;
    b.model.mla = a.model.mla, b.model.mla.q_lora_rank = 0, b.model.n_kv_head = b.model.n_head;
    ust_config t = c, u = b, w = a; /* model.mtp's modules: dense, latent and MoE blocks */
    t.model.mtp.depth = 2, u.model.mtp.depth = 1, w.model.mtp.depth = 2;
    const ust_config *all[] = {&c, &g, &m, &s, &d, &q, &a, &b, &t, &u, &w};
    const char *names[] = {"llama",
                           "gpt2 (tied, biases, positions)",
                           "llama MoE",
                           "gpt2 MoE every 2 with a shared expert",
                           "first_dense 1, shared_d_ff 160",
                           "moe.layers 0,1,0,1",
                           "mla with a q latent, over MoE",
                           "mla without a q latent",
                           "mtp depth 2",
                           "mtp over mla",
                           "mtp over mla and MoE (the modules' blocks MoE)"};
    for (int i = 0; i < 11; i++) {
        mem_plan p;
        plan_memory(all[i], &p);
        planner_model_sizes(all[i], &z);
        CHECK(z.n_params == (double)p.n_params, "%s: planner %.0f, memory plan %lld", names[i],
              z.n_params, (long long)p.n_params);
    }
}

/* A mixed model's MoE layers sit unevenly on the pipeline: with 4 layers on pp = 2 and the
 * first 2 dense, rank 1 holds both MoE layers, so its expert traffic is that of a model whose
 * every layer is MoE (not half of it), and the compute stretches to the slower stage's. */
static void test_mixed_layers_count_on_the_rank_that_holds_them() {
    ust_config m, d, a, b;
    moe(&m);
    d = m, d.model.moe.first_dense = 2;
    planner_hw hw = hw_of(1e11, 1e10, 8);
    CHECK(!layout(&a, &m, LAYOUT(.dp = 2, .ep = 2, .pp = 2), 8), "all MoE layout");
    CHECK(!layout(&b, &d, LAYOUT(.dp = 2, .ep = 2, .pp = 2), 8), "first_dense layout");
    planner_cost ca, cb;
    planner_estimate(&a, &hw, &ca);
    planner_estimate(&b, &hw, &cb);
    CHECK_CLOSE(cb.group[PLAN_EP], ca.group[PLAN_EP], 0, 1e-12, "ep time of the MoE stage");
    planner_sizes z;
    planner_model_sizes(&b, &z);
    CHECK(z.n_moe == 2, "2 MoE layers, %d", z.n_moe);
    /* per layer: attention + its MLP (or its router and active experts) + scores' 2 C T */
    double T = b.train.seq_len, C = b.model.d_model, L = b.model.n_layer;
    double fd = z.attn + z.mlp + 2 * C * T, fm = z.attn + 2 * C * T + z.mm_moe / z.n_moe;
    double slowest = 2 * (fd > fm ? fd : fm) / (fd + fm);
    double tokens = (double)b.train.global_batch_size * T;
    double flops = tokens / 2 * (6 * z.mm_dense + 12 * L * C * T + 6 * z.mm_moe) / 2;
    CHECK(slowest > 1.01, "the stages differ: %g", slowest);
    CHECK_CLOSE(cb.compute, slowest * flops / (hw.mfu * hw.peak_flops), 0, 1e-9,
                "compute at the slower stage's pace");
}

static void test_flops_per_token_by_hand() {
    ust_config c, m;
    tiny(&c);
    /* matmul weights: 4 layers x (q,o 2*128*128 + k,v 2*64*128 + MLP 3*384*128) + lm_head
     * 512*128 = 851968; attention 12*L*C*T = 12*4*128*128 */
    CHECK_CLOSE(planner_flops_per_token(&c), 6.0 * 851968 + 786432, 0, RT, "dense");
    moe(&m);
    /* each MoE layer: router 4*128 and top_k = 2 of the 4 experts, 3*64*128 each */
    double mm = 4 * 49152.0 + 65536 + 4 * (512 + 2 * 3 * 64 * 128.0);
    CHECK_CLOSE(planner_flops_per_token(&m), 6 * mm + 786432, 0, RT, "MoE: active experts only");
    /* latent attention (4 heads): q 24*128 + 80*24, kv_a 24*128, kv_b 4*28*16, o 128*64 = 18048
     * a layer; scores over the 20-wide q/k heads, values 16 wide: 6*L*H*(20+16)*T */
    tiny(&c);
    c.model.n_kv_head = c.model.n_head, c.model.mla.enabled = true, c.model.mla.q_lora_rank = 24;
    c.model.mla.kv_lora_rank = 16, c.model.mla.qk_nope_head_dim = 12;
    c.model.mla.qk_rope_head_dim = 8, c.model.mla.v_head_dim = 16;
    CHECK_CLOSE(planner_flops_per_token(&c), 6.0 * (4 * (18048 + 147456) + 65536) + 442368, 0, RT,
                "MLA");
}

/* model.mtp's D modules (DeepSeek-V3's, dense blocks): each a projection from 2C (2 x 128^2), a
 * block as the tiny model's (attention 49152, MLP 147456) and logits through the shared head
 * (512 x 128): 294912 weights, and full attention over T (6 x 4 heads x 64 x 128 = 196608). */
static void test_flops_per_token_counts_mtp_modules() {
    ust_config c;
    tiny(&c);
    c.model.mtp.depth = 2;
    CHECK_CLOSE(planner_flops_per_token(&c), 6.0 * (851968 + 2 * 294912) + 786432 + 2 * 196608, 0,
                RT, "mtp depth 2");
    /* the modules run on the last stage: pp 2's slowest stage is the last */
    ust_config b, l;
    tiny(&b);
    b.model.mtp.depth = 2;
    CHECK(!layout(&l, &b, LAYOUT(.pp = 2), 4), "pp2");
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    planner_estimate(&l, &hw, &k);
    planner_sizes z;
    planner_model_sizes(&b, &z);
    double layer = z.attn + z.mlp + 32768, mtp = 294912 + 32768; /* FLOPs / 6, attention 32768 */
    double mean = (4 * layer + 2 * mtp) / 2, last = 2 * layer + 2 * mtp;
    double flops = 4 * 128 / 2.0 * planner_flops_per_token(&b);
    CHECK_CLOSE(k.compute, last / mean * flops / 0.5e12, 0, 1e-12, "the last stage's pace");
}

/* What a run's MFU divides by (model_flops_per_token, from the model's own tensor list) equals
 * the planner's count: windows, MoE's active experts (a shared expert, a dense first layer, tied
 * embeddings), latent attention with MTP, MTP over MoE (its block an MoE layer), a decoupled
 * head_dim, gpt2. */
static void test_flops_per_token_equal_the_models() {
    const char *sets[][6] = {
        {"model.sliding_window=[8,300,32,300]", NULL},
        {"model.moe.num_experts=4", "model.moe.top_k=1", "model.moe.d_ff_expert=64",
         "model.moe.first_dense=1", "model.moe.shared_expert=true", "model.tie_embeddings=true"},
        {"model.n_kv_head=4", "model.mla.enabled=true", "model.mla.kv_lora_rank=32",
         "model.mla.qk_nope_head_dim=16", "model.mla.qk_rope_head_dim=16", "model.mtp.depth=2"},
        {"model.moe.num_experts=4", "model.moe.top_k=1", "model.moe.d_ff_expert=64",
         "model.moe.first_dense=1", "model.moe.shared_expert=true", "model.mtp.depth=1"},
        {"model.head_dim=48", NULL},
        {"model.arch=gpt2", "model.n_kv_head=4", NULL}};
    ust_ops *ops = ops_cpu_create(1, 1);
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        ust_config c;
        ust_err e;
        tiny(&c);
        c.model.mla.v_head_dim = 16;
        for (int k = 0; k < 6 && sets[i][k]; k++)
            CHECK(!cfg_set(&c, sets[i][k], &e), "%s: %s", sets[i][k], e.msg);
        ust_arena a;
        mem_init(&a, ops);
        model *m;
        CHECK(!model_create(&m, &c, ops, &a, &e), "case %zu: %s", i, e.msg);
        double got = model_flops_per_token(m), want = planner_flops_per_token(&c);
        CHECK(fabs(got - want) <= 1e-12 * want, "case %zu: the model %.17g, the planner %.17g", i,
              got, want);
        model_destroy(m);
        mem_release(&a);
    }
    ops->destroy(ops);
}

/* Sliding-window layers are charged the keys of their window, not the sequence's (issue 35):
 * the tiny model (L 4, C 128, T 128) with windows 32, none, 16, none. */
static void test_flops_per_token_counts_each_window() {
    ust_config c;
    tiny(&c);
    snprintf(c.model.sliding_window, sizeof c.model.sliding_window, "32,%d,16,%d",
             c.model.max_seq_len, c.model.max_seq_len);
    /* matmul weights as the dense case (851968); attention 6 x 2C per key over 32 + 128 + 16 +
     * 128 keys a query, where full attention counts 4 x 128 (786432 = 6 x 256 x 512) */
    CHECK_CLOSE(planner_flops_per_token(&c), 6.0 * 851968 + 6.0 * 256 * 304, 0, RT, "windows");
    /* a window as long as the sequence is full attention */
    snprintf(c.model.sliding_window, sizeof c.model.sliding_window, "128");
    CHECK_CLOSE(planner_flops_per_token(&c), 6.0 * 851968 + 786432, 0, RT, "window = T");
    /* pp 2: stage 0 (windows 32 and none: 160 keys) is slower than stage 1 (16 and none: 144),
     * and the step runs at its pace; per layer its matmul parameters plus 2C keys */
    ust_config b, l;
    tiny(&b);
    snprintf(b.model.sliding_window, sizeof b.model.sliding_window, "32,%d,16,%d",
             b.model.max_seq_len, b.model.max_seq_len);
    CHECK(!layout(&l, &b, LAYOUT(.pp = 2), 8), "pp2 with windows");
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    planner_estimate(&l, &hw, &k);
    planner_sizes z;
    planner_model_sizes(&l, &z);
    double w0 = 2 * (z.attn + z.mlp) + 256.0 * 160, w1 = 2 * (z.attn + z.mlp) + 256.0 * 144;
    double flops = 8 * 128 * (6.0 * 851968 + 6.0 * 256 * 304) / 2;
    CHECK_CLOSE(k.compute, w0 / ((w0 + w1) / 2) * flops / 0.5e12, 0, 1e-12, "pp2 compute");
    /* full recompute adds the forward's 2 x 2C per key */
    l.train.recompute = RECOMPUTE_FULL;
    planner_estimate(&l, &hw, &k);
    flops = 8 * 128 * (8.0 * 851968 + 8.0 * 256 * 304) / 2;
    CHECK_CLOSE(k.compute, w0 / ((w0 + w1) / 2) * flops / 0.5e12, 0, 1e-12, "full recompute");
}

/* compute = tokens x FLOP/token / ranks / (mfu x peak); 1f1b's bubble (p-1)/m of it, interleaved
 * (p-1)/(v*m) */
static void test_compute_and_pipeline_bubble() {
    ust_config base, c;
    tiny(&base);
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2, .micro_batch = 1), 8), "pp2");
    planner_estimate(&c, &hw, &k);
    double compute = 8 * 128 * 5898240.0 / 2 / 0.5e12;
    CHECK_CLOSE(k.compute, compute, 0, RT, "compute, pp 2");
    CHECK_CLOSE(k.bubble, compute / 8, 0, RT, "bubble (2-1)/8");
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2, .vpp = 2, .schedule = PP_INTERLEAVED), 8), "pp2 vpp2");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.bubble, compute / 16, 0, RT, "bubble (2-1)/(2*8)");
    /* the schedule's own published bubble, F = B = W: dualpipev (p-1)(F+2B-W)/(2m(F+B+W)) at
     * vpp 2, zb (p-1)(F+B-W)/(m(F+B+W)) */
    c.parallel.pp_schedule = PP_DUALPIPEV;
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.bubble, compute * 2.0 / (2 * 8 * 3), 0, RT, "dualpipev bubble 1*2/(2*8*3)");
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2, .micro_batch = 1), 8), "pp2");
    c.parallel.pp_schedule = PP_ZB;
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.bubble, compute / (8 * 3), 0, RT, "zb bubble 1*1/(8*3)");
    CHECK(!layout(&c, &base, LAYOUT(.dp = 4, .micro_batch = 2), 8), "dp4");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.compute, 8 * 128 * 5898240.0 / 4 / 0.5e12, 0, RT, "compute, dp 4");
    CHECK(k.bubble == 0, "no pipeline, no bubble");
    /* full recomputation adds a forward: 2 x matmul weights + 4 L C T per token */
    c.train.recompute = RECOMPUTE_FULL;
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.compute, 8 * 128 * (5898240.0 + 2 * 851968 + 262144) / 4 / 0.5e12, 0, RT,
                "compute, full recompute");
}

/* MoE under tp: the tp ranks split the MoE layers' tokens, so a rank's whole compute (dense and
 * experts) is the tp=1 rank's / tp */
static void test_moe_compute_splits_over_tp() {
    ust_config base, c;
    moe(&base);
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k1, k2;
    CHECK(!layout(&c, &base, LAYOUT(.micro_batch = 1), 8), "MoE tp1");
    planner_estimate(&c, &hw, &k1);
    CHECK_CLOSE(k1.compute, 8 * 128 * planner_flops_per_token(&c) / 0.5e12, 0, RT, "MoE tp1");
    CHECK(!layout(&c, &base, LAYOUT(.tp = 2, .micro_batch = 1), 8), "MoE tp2");
    planner_estimate(&c, &hw, &k2);
    CHECK_CLOSE(k2.compute, k1.compute / 2, 0, RT, "MoE FLOPs per rank halve at tp 2");
}

/* dp-only: one all-reduce of the fp32 gradients, 2(n-1)/n * 4 * params / bw, intra-node when the
 * group fits a node; ZeRO-2 reduce-scatters every micro-batch, ZeRO-3 also gathers twice */
static void test_dp_only_gradient_all_reduce() {
    ust_config base, c;
    tiny(&base);
    double P = 918656, m = 4;
    planner_hw hw = hw_of(100e9, 10e9, 8);
    planner_cost k;
    for (int z = 0; z <= 3; z++) {
        CHECK(!layout(&c, &base, LAYOUT(.dp = 8, .zero = z), 32), "dp8");
        planner_estimate(&c, &hw, &k);
        double ar = 2.0 * 7 / 8 * 4 * P / 100e9, rs = 7.0 / 8 * 4 * P / 100e9;
        double want[] = {ar, ar, m * rs + rs, m * 3 * rs};
        CHECK_CLOSE(k.group[PLAN_DP], want[z], 0, RT, "dp 8 intra-node");
        CHECK(k.intra[PLAN_DP], "8 ranks in a node of 8");
        CHECK(k.comm == k.group[PLAN_DP], "only dp communicates");
    }
    hw = hw_of(100e9, 10e9, 4);
    CHECK(!layout(&c, &base, LAYOUT(.dp = 8), 32), "dp8");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_DP], 2.0 * 7 / 8 * 4 * P / 10e9, 0, RT, "dp 8 over nodes of 4");
    CHECK(!k.intra[PLAN_DP], "8 ranks over nodes of 4");
}

/* TP per micro-batch: a layer's 4 all-reduces of the (B, T, C) rows = 8 units of (n-1)/n * a;
 * with sp 10 units (2 extra re-gathers in backward); embedding + lm_head 4 units */
static void test_tp_volume_per_layer() {
    ust_config base, c;
    tiny(&base);
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    double a = 4.0 * 2 * 128 * 128, unit = 0.5 * a / 1e9, m = 2; /* mbs 2, 2 micro-batches */
    CHECK(!layout(&c, &base, LAYOUT(.tp = 2, .micro_batch = 2), 4), "tp2");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_TP], m * (4 * 8 + 4) * unit, 0, RT, "tp 2");
    CHECK_CLOSE(k.group[PLAN_TP], m * (4 * 4 + 2) * planner_allreduce_s(a, 2, 1e9), 0, RT,
                "tp 2 as all-reduces");
    CHECK(!layout(&c, &base, LAYOUT(.tp = 2, .micro_batch = 2, .sp = true), 4), "tp2 sp");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_TP], m * (4 * 10 + 4) * unit, 0, RT, "tp 2 with sp");
    CHECK(k.group[PLAN_DP] == 0 && k.group[PLAN_PP] == 0, "no other group");
}

/* CP ring: the local K/V block (B, T/cp, 2 * kv heads * head dim) makes n-1 hops forward, n-1
 * backward and its gradients n hops (home): 3n - 2 blocks per layer per micro-batch (what the
 * comm counters measure); the all-gather variant 3 (n-1). Ulysses over a ranks: (a-1) parts of
 * B*Tl*D per head, 6 Hq + 6 Hk heads (q, k, v there, out back forward; q, k, v, out, d out there,
 * dq, dk, dv back backward); the 2x2 hybrid adds the ring over 2 blocks of a*Tl tokens. */
/* Latent attention under cp passes its latent (model.mla.cp_latent): a block is B x Tl x
 * (kv_lora_rank 16 + qk_rope_head_dim 8) values, n-1 hops forward, n-1 backward and its gradient
 * n-1 (none on the first hop): 9 blocks at cp 4, ring and all-gather alike, as
 * test/sh/equiv_mla.sh's counters; with cp_latent off the K/V ring's 3n - 2 blocks of 2 x 4
 * heads x (24 + 8). */
static void test_cp_latent_ring_passes() {
    ust_config base, c;
    tiny(&base);
    base.model.n_kv_head = base.model.n_head;
    base.model.mla.enabled = true, base.model.mla.kv_lora_rank = 16;
    base.model.mla.qk_nope_head_dim = 24, base.model.mla.qk_rope_head_dim = 8;
    base.model.mla.v_head_dim = 16;
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    double lat = 4.0 * 1 * 32 * (16 + 8), kv = 4.0 * 1 * 32 * 2 * 4 * 32;
    for (int g = 0; g < 2; g++) {
        base.parallel.cp_comm = g ? CP_ALLGATHER : CP_RING;
        CHECK(!layout(&c, &base, LAYOUT(.cp = 4), 2), "cp4 mla");
        planner_estimate(&c, &hw, &k);
        CHECK_CLOSE(k.group[PLAN_CP], 2 * 4 * 9 * lat / 1e9, 0, RT,
                    g ? "cp 4 latent, allgather" : "cp 4 latent ring");
    }
    base.parallel.cp_comm = CP_RING, base.model.mla.cp_latent = false;
    CHECK(!layout(&c, &base, LAYOUT(.cp = 4), 2), "cp4 mla, K/V");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_CP], 2 * 4 * 10 * kv / 1e9, 0, RT, "cp 4 mla K/V");
}

static void test_cp_ring_kv_passes() {
    ust_config base, c;
    tiny(&base);
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    CHECK(!layout(&c, &base, LAYOUT(.cp = 2), 2), "cp2");
    planner_estimate(&c, &hw, &k);
    double kv = 4.0 * 1 * 64 * 2 * 2 * 32;
    CHECK_CLOSE(k.group[PLAN_CP], 2 * 4 * 4 * kv / 1e9, 0, RT, "cp 2, 2 micro-batches");
    base.parallel.cp_comm = CP_ALLGATHER;
    CHECK(!layout(&c, &base, LAYOUT(.cp = 2), 2), "cp2 allgather");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_CP], 2 * 4 * 3 * kv / 1e9, 0, RT, "cp 2 allgather");
    base.parallel.cp_comm = CP_A2A; /* 4 heads, 2 kv heads: Hq 2, Hk 1 */
    CHECK(!layout(&c, &base, LAYOUT(.cp = 2), 2), "cp2 a2a");
    planner_estimate(&c, &hw, &k);
    double u = 1 * 4.0 * 1 * 64 * 32;
    CHECK_CLOSE(k.group[PLAN_CP], 2 * 4 * 18 * u / 1e9, 0, RT, "cp 2 a2a");
    base.parallel.cp_comm = CP_A2A_RING, base.parallel.cp_a2a = 2;
    CHECK(!layout(&c, &base, LAYOUT(.cp = 4), 2), "cp4 a2a+ring");
    planner_estimate(&c, &hw, &k);
    double u4 = 1 * 4.0 * 1 * 32 * 32, blk = 4.0 * 1 * 32 * 2 * 2 * 1 * 32;
    CHECK_CLOSE(k.group[PLAN_CP], 2 * 4 * (18 * u4 + (2 + 2) * blk) / 1e9, 0, RT, "cp 4 a2a+ring");
    base.parallel.cp_comm = CP_RING, base.parallel.cp_a2a = 0;
    CHECK(!layout(&c, &base, LAYOUT(.cp = 2), 2), "cp2 again");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_DP], 2.0 / 2 * 4 * 918656 / 1e9, 0, RT,
                "cp ranks reduce gradients too");
}

/* The ring's routes, as test/sh/cp_attention.sh counts them by hand (cp 4, T 32; a block-send is
 * one block's k and v or their gradients): a block goes hops ranks on, each passing it 3 times
 * (k, v forward, again backward, dk, dv with them), and its gradients go home from its last rank.
 * zigzag full: hops 3 each, 40 a layer (10 on every rank); contiguous full (causal): 3, 2, 1, 0,
 * 21 (rank 2 passes blocks 0, 1, 2: 9); window 4, contiguous: 1, 1, 1, 0, 12 (ranks 1, 2: 3 and
 * a home, 4); zigzag: 1, 3, 3, 3, 34; a2a+ring in pairs, contiguous: 2 blocks, 1, 0, 4 a ring.
 * Full recompute passes each once more: contiguous full 27. cp 2: 3 + 1 on each rank. The estimate
 * of the window_sizes.sh model ([4, 8, 64, 8], a2a+ring over pairs, contiguous, 4 micro-batches)
 * sends what its run measures (comm_bytes_cp_group 852992: the ring 4 x 4 layers x 2 rings x 2048 x
 * 4, Ulysses' 18 x 512 x 4 layers x 4 ranks x 4, and each window's starts gathered, 2 x 32 x 4 x
 * 4). */
static void test_cp_ring_routes_by_hand() {
    ust_config c;
    tiny(&c);
    c.model.n_layer = 1, c.model.max_seq_len = 64, c.train.seq_len = 32;
    struct {
        ust_cp_layout layout;
        const char *window;
        int rn, a, full;
        double group, busiest;
    } k[] = {{CP_ZIGZAG, "", 4, 1, 0, 40, 10},     {CP_CONTIGUOUS, "", 4, 1, 0, 21, 9},
             {CP_CONTIGUOUS, "4", 4, 1, 0, 12, 4}, {CP_ZIGZAG, "4", 4, 1, 0, 34, 10},
             {CP_CONTIGUOUS, "4", 2, 2, 0, 4, 3},  {CP_CONTIGUOUS, "", 4, 1, 1, 27, 12},
             {CP_ZIGZAG, "", 2, 1, 0, 8, 4}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        c.parallel.cp_layout = k[i].layout;
        c.train.recompute = k[i].full ? RECOMPUTE_FULL : RECOMPUTE_NONE;
        snprintf(c.model.sliding_window, sizeof c.model.sliding_window, "%s", k[i].window);
        planner_ring r;
        planner_ring_sends(&c, k[i].rn, k[i].a, &r);
        CHECK(r.group == k[i].group && r.busiest == k[i].busiest,
              "case %zu: %g block-sends a layer (%g on the busiest rank), by hand %g (%g)", i,
              r.group, r.busiest, k[i].group, k[i].busiest);
    }
    ust_config base, e;
    cfg_defaults(&base);
    base.model.n_layer = 4, base.model.d_model = 64, base.model.d_ff = 128;
    base.model.vocab_size = 500, base.model.max_seq_len = 64, base.train.seq_len = 32;
    snprintf(base.model.sliding_window, sizeof base.model.sliding_window, "4,8,64,8");
    base.parallel.cp_comm = CP_A2A_RING, base.parallel.cp_a2a = 2;
    base.parallel.cp_layout = CP_CONTIGUOUS;
    CHECK(!layout(&e, &base, LAYOUT(.cp = 4), 4), "a2a+ring");
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost o;
    planner_estimate(&e, &hw, &o);
    CHECK(o.cp_group == 852992, "the group sends %.0f bytes, its run 852992", o.cp_group);
}

/* PP: each micro-batch sends its activations (B, T, C) forward and their gradient back over each
 * of the v chunk boundaries; inter-node when the pipeline spans nodes */
static void test_pp_p2p_activations() {
    ust_config base, c;
    tiny(&base);
    planner_hw hw = hw_of(1e9, 1e8, 2);
    planner_cost k;
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2), 8), "pp2");
    planner_estimate(&c, &hw, &k);
    CHECK_CLOSE(k.group[PLAN_PP], 2.0 * 8 * 4 * 128 * 128 / 1e9, 0, RT, "pp 2 in a node of 2");
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2, .dp = 2, .vpp = 2, .schedule = PP_INTERLEAVED), 16),
          "dp2 pp2 vpp2");
    planner_estimate(&c, &hw, &k);
    CHECK(!k.intra[PLAN_PP] && k.intra[PLAN_DP], "dp inside the node, pp across");
    CHECK_CLOSE(k.group[PLAN_PP], 2.0 * 2 * 8 * 4 * 128 * 128 / 1e8, 0, RT, "vpp 2 across nodes");
}

/* EP: every token to its top_k experts and back, forward and backward: 4 all-to-alls of
 * (B * T * k, C) rows per MoE layer */
static void test_ep_all_to_all() {
    ust_config base, c;
    moe(&base);
    planner_hw hw = hw_of(1e9, 1e9, 8);
    planner_cost k;
    CHECK(!layout(&c, &base, LAYOUT(.dp = 2, .ep = 2), 2), "dp2 ep2");
    planner_estimate(&c, &hw, &k);
    double rows = 128 * 2, bytes = 4 * rows * 128;
    CHECK_CLOSE(k.group[PLAN_EP], 4 * 4 * 0.5 * bytes / 1e9, 0, RT, "ep 2, 4 MoE layers");
    /* dense gradients over dp 2, each rank's 2 experts per layer over expert-dp 1 */
    double dense = 65536 + 65664 + 4 * (49408 + 4 * 128);
    CHECK_CLOSE(k.group[PLAN_DP], 2.0 / 2 * 4 * dense / 1e9, 0, RT, "experts are not reduced");
    CHECK(k.intra[PLAN_EP] && k.ep_inter == 0, "ep 2 inside a node: nothing across nodes");
    /* ep 4 over nodes of 2 GPUs: of the 3 members a rank sends to, 2 are on the other node */
    hw = hw_of(1e9, 1e8, 2);
    CHECK(!layout(&c, &base, LAYOUT(.dp = 4, .ep = 4), 4), "dp4 ep4");
    planner_estimate(&c, &hw, &k);
    CHECK(!k.intra[PLAN_EP] && k.sent[PLAN_EP] > 0, "ep 4 spans 2 nodes");
    CHECK_CLOSE(k.ep_inter, 2.0 / 3 * k.sent[PLAN_EP], 0, RT, "ep 4: 2 of 3 parts across nodes");
}

static int sorted(const planner_entry *e, long n) {
    for (long i = 1; i < n; i++)
        if (planner_compare(&e[i - 1], &e[i]) > 0) return 0;
    return 1;
}

static int sign(int x) { return (x > 0) - (x < 0); }

/* e sorted by planner_compare is consistent with a strict weak order that ties no two distinct
 * layouts: every earlier entry compares below every later one (so sorting is deterministic,
 * whatever order the search enumerated in), comparisons are antisymmetric, and only an entry
 * ties with itself. O(n^2): the searches here give a few thousand entries. */
static int strict_total_order(const planner_entry *e, long n) {
    for (long i = 0; i < n; i++) {
        if (planner_compare(&e[i], &e[i]) != 0) return 0;
        for (long j = i + 1; j < n; j++) {
            int ij = planner_compare(&e[i], &e[j]), ji = planner_compare(&e[j], &e[i]);
            if (ij >= 0 || sign(ji) != -sign(ij)) {
                printf("# entries %ld, %ld: compare %d, %d\n", i, j, ij, ji);
                return 0;
            }
        }
    }
    return 1;
}

/* Infinite bandwidth: every layout without a pipeline or full recompute takes exactly the ideal
 * compute time, and the tie goes to the largest micro-batch (dp 1 over 4 ranks: tp2 x cp2 or
 * cp4, all 8 sequences at once). So does dualpipe at pp 2, whose published bubble
 * (pp/2-1)(F&B+B-3W) vanishes there, but it needs at least 4 micro-batches: 2 sequences each at
 * most, and the larger micro-batch wins the tie. Every other pipeline pays a bubble. */
static void test_ranking_without_communication_cost() {
    ust_config c;
    tiny(&c);
    planner_hw hw = hw_of(1e30, 1e30, 8);
    planner_entry *e;
    planner_stats st;
    long n = planner_search(&c, 4, &hw, &e, &st);
    CHECK(n > 0 && n == st.fitting && st.over_mem == 0, "%ld fitting", n);
    CHECK(sorted(e, n), "sorted by planner_compare");
    CHECK(strict_total_order(e, n), "a strict order over all %ld entries, schedules included", n);
    planner_layout b = e[0].l;
    CHECK_CLOSE(e[0].cost.total, 8 * 128 * 5898240.0 / 4 / 0.5e12, 0, 1e-9, "ideal compute");
    CHECK(b.pp == 1 && b.recompute != RECOMPUTE_FULL && b.dp == 1 && b.micro_batch == 8,
          "best dp %d pp %d micro-batch %d recompute %d", b.dp, b.pp, b.micro_batch, b.recompute);
    long dualpipe2 = 0;
    for (long i = 0; i < n; i++) {
        const planner_layout *l = &e[i].l;
        if (l->pp == 2 && l->schedule == PP_DUALPIPE && l->recompute != RECOMPUTE_FULL) {
            CHECK(e[i].cost.bubble == 0 && l->micro_batch <= 2, "dualpipe pp 2: bubble %g, mbs %d",
                  e[i].cost.bubble, l->micro_batch);
            CHECK_CLOSE(e[i].cost.total, e[0].cost.total, 0, 1e-9, "dualpipe pp 2: ideal compute");
            dualpipe2++;
        } else if (l->pp > 1 || l->recompute == RECOMPUTE_FULL) {
            CHECK(e[i].cost.total > e[0].cost.total, "a bubble or a recompute costs time");
        }
    }
    CHECK(dualpipe2 > 0, "the search tries dualpipe at pp 2");
    free(e);
}

/* Fast NVLink, a very slow network, 2 nodes of 8: the best layout keeps every group but the
 * pipeline inside a node (the Playbook: pp across nodes, its p2p is the smallest traffic) */
static void test_ranking_puts_the_pipeline_across_slow_nodes() {
    ust_config c;
    tiny(&c);
    c.train.global_batch_size = 16;
    planner_hw hw = hw_of(1e15, 1e6, 8);
    planner_entry *e;
    planner_stats st;
    long n = planner_search(&c, 16, &hw, &e, &st);
    CHECK(n > 0 && sorted(e, n), "%ld fitting", n);
    planner_layout b = e[0].l;
    CHECK(b.pp == 2 && !e[0].cost.intra[PLAN_PP], "best pp %d (dp %d tp %d cp %d)", b.pp, b.dp,
          b.tp, b.cp);
    CHECK(e[0].cost.intra[PLAN_DP] && e[0].cost.intra[PLAN_TP] && e[0].cost.intra[PLAN_CP],
          "the rest inside a node");
    free(e);
}

/* The memory filter uses the memory plan of `validate`; per-mesh dedup keeps each mesh's best. */
static void test_memory_filter_and_best_per_mesh() {
    ust_config c;
    tiny(&c);
    planner_hw hw = hw_of(450e9, 50e9, 8);
    planner_entry *e;
    planner_stats st;
    long all = planner_search(&c, 4, &hw, &e, &st);
    double lo = e[0].cost.mem, hi = lo;
    for (long i = 0; i < all; i++) {
        lo = e[i].cost.mem < lo ? e[i].cost.mem : lo;
        hi = e[i].cost.mem > hi ? e[i].cost.mem : hi;
    }
    free(e);
    hw.gpu_mem = (lo + hi) / 2;
    long n = planner_search(&c, 4, &hw, &e, &st);
    CHECK(n > 0 && st.over_mem > 0 && n + st.over_mem == all, "%ld fit, %ld over, %ld valid", n,
          st.over_mem, all);
    CHECK(st.smallest.cost.mem == lo, "the smallest layout is reported");
    for (long i = 0; i < n; i++) {
        ust_config x;
        planner_apply(&c, &e[i].l, &x);
        mem_plan p;
        plan_memory(&x, &p);
        CHECK(e[i].cost.mem == p.total && p.total <= hw.gpu_mem, "entry %ld: %.0f vs plan %.0f", i,
              e[i].cost.mem, p.total);
    }
    planner_entry first = e[0];
    long k = planner_best_per_mesh(e, n);
    CHECK(k < n && memcmp(&e[0], &first, sizeof first) == 0, "%ld meshes of %ld", k, n);
    for (long i = 0; i < k; i++)
        for (long j = i + 1; j < k; j++)
            CHECK(!(e[i].l.dp == e[j].l.dp && e[i].l.tp == e[j].l.tp && e[i].l.pp == e[j].l.pp &&
                    e[i].l.vpp == e[j].l.vpp && e[i].l.cp == e[j].l.cp && e[i].l.ep == e[j].l.ep),
                  "mesh listed twice");
    free(e);
}

/* dualpipe's two copies of its stages' parameters are summed over the mirror pair (ranks r and
 * pp-1-r) after every step: one fp32 all-reduce over 2 ranks at the pp group's bandwidth, on top
 * of the p2p a 1f1b rank sends (each micro-batch still visits each rank once). At pp 2 a rank's
 * two stages are the whole model: P = 918656 parameters. The DP reduction covers both copies. */
static void test_dualpipe_estimate_includes_the_mirror_all_reduce() {
    ust_config base, c;
    tiny(&base);
    planner_hw hw = hw_of(1e9, 1e8, 8);
    planner_cost k1, k2;
    double P = 918656, p2p = 2.0 * 8 * 4 * 128 * 128 / 1e9; /* 8 micro-batches, one chunk */
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2), 8), "pp2 1f1b");
    planner_estimate(&c, &hw, &k1);
    CHECK(!layout(&c, &base, LAYOUT(.pp = 2, .vpp = 2, .schedule = PP_DUALPIPE), 8),
          "pp2 dualpipe");
    planner_estimate(&c, &hw, &k2);
    CHECK_CLOSE(k1.group[PLAN_PP], p2p, 0, RT, "1f1b: p2p only");
    CHECK_CLOSE(k2.group[PLAN_PP], p2p + planner_allreduce_s(4 * P, 2, 1e9), 0, RT,
                "dualpipe: p2p + the mirror all-reduce of both copies");
    CHECK(k1.compute == k2.compute, "same compute");
    CHECK_CLOSE(k2.comm - k1.comm, 4 * P / 1e9, 0, 1e-9, "the difference is the all-reduce");
    CHECK(!layout(&c, &base, LAYOUT(.dp = 2, .pp = 2, .vpp = 2, .schedule = PP_DUALPIPE), 16),
          "dp2 pp2 dualpipe");
    planner_estimate(&c, &hw, &k2);
    CHECK(k2.intra[PLAN_DP] && k2.intra[PLAN_PP], "a node of 8 holds both");
    CHECK_CLOSE(k2.group[PLAN_DP], planner_allreduce_s(4 * P, 2, 1e9), 0, RT, "dp: both copies");
}

/* A pipeline of 4 stages over 8 layers, 64 micro-batches: with free communication the best pp 4
 * layout is dualpipe, whose published bubble 2/(3m) is the smallest (zb and dualpipev 3/(3m),
 * interleaved at vpp 2 1.5/m, 1f1b 3/m); when the pipeline's link is slow, dualpipe's mirror
 * all-reduce (both copies of half the model) and dualpipev's doubled p2p outweigh that, and zb
 * wins. In both cases a zero-bubble schedule beats the best 1f1b layout. */
static void best_pp4(const ust_config *c, const planner_hw *hw, planner_entry *best,
                     planner_entry *best_1f1b) {
    planner_entry *e;
    planner_stats st;
    long n = planner_search(c, 4, hw, &e, &st);
    CHECK(n > 0 && sorted(e, n), "%ld fitting", n);
    long b = -1, b1 = -1;
    for (long i = n - 1; i >= 0; i--)
        if (e[i].l.pp == 4) {
            b = i;
            if (e[i].l.schedule == PP_1F1B) b1 = i;
        }
    CHECK(b >= 0 && b1 >= 0, "pp 4 layouts: best %ld, best 1f1b %ld", b, b1);
    if (b >= 0) *best = e[b];
    if (b1 >= 0) *best_1f1b = e[b1];
    free(e);
}

static void test_deep_pipeline_prefers_a_zero_bubble_schedule() {
    ust_config c;
    tiny(&c);
    c.model.n_layer = 8, c.train.global_batch_size = 64;
    planner_entry b, b1;
    planner_hw fast = hw_of(1e30, 1e30, 8);
    best_pp4(&c, &fast, &b, &b1);
    CHECK(b.l.schedule == PP_DUALPIPE && b.l.micro_batch == 1,
          "free links: best pp 4 schedule %s, micro-batch %d", pps_kind_name(b.l.schedule),
          b.l.micro_batch);
    CHECK_CLOSE(b.cost.bubble / b.cost.compute, 2.0 / (3 * 64), 0, RT, "dualpipe bubble 2/(3m)");
    CHECK(b.cost.total < b1.cost.total, "dualpipe %g s < 1f1b %g s", b.cost.total, b1.cost.total);
    /* one GPU per node: the pipeline crosses a slow network, every other group is empty */
    planner_hw slow = hw_of(1e30, 1e9, 1);
    best_pp4(&c, &slow, &b, &b1);
    CHECK(b.l.schedule == PP_ZB, "slow link: best pp 4 schedule %s", pps_kind_name(b.l.schedule));
    CHECK(b.cost.total < b1.cost.total, "zb %g s < 1f1b %g s", b.cost.total, b1.cost.total);
    CHECK(b.cost.comm == b1.cost.comm && b.cost.bubble < b1.cost.bubble,
          "zb: the same p2p, a smaller bubble");
}

/* Every proposed layout is one cfg_validate accepts, under the schedules' own restrictions: a
 * tied gpt2 MoE model (no zb: MoE; the dual pipes: no ZeRO-2/3 with tied embeddings) and a
 * global batch small enough that the micro-batch minimums bite. pp 1 proposes 1f1b only. A dense
 * untied model gets every searched schedule. */
static void test_planner_never_proposes_a_schedule_validate_refuses() {
    ust_config m, d;
    moe(&m);
    m.model.arch = ARCH_GPT2, m.model.n_kv_head = 4, m.train.global_batch_size = 8;
    tiny(&d);
    d.train.global_batch_size = 16;
    const ust_config *cases[] = {&m, &d};
    planner_hw hw = hw_of(450e9, 50e9, 8);
    for (int t = 0; t < 2; t++) {
        const ust_config *c = cases[t];
        planner_entry *e;
        planner_stats st;
        long n = planner_search(c, 8, &hw, &e, &st), seen[PP_DUALPIPE + 1] = {0};
        CHECK(n > 0 && st.invalid > 0, "case %d: %ld fitting, %ld refused", t, n, st.invalid);
        CHECK(strict_total_order(e, n), "case %d: a strict order over %ld entries", t, n);
        for (long i = 0; i < n; i++) {
            const planner_layout *l = &e[i].l;
            ust_config x;
            ust_err err;
            planner_apply(c, l, &x);
            CHECK(!cfg_validate(&x, 8, &err), "case %d entry %ld (%s): %s", t, i,
                  pps_kind_name(l->schedule), err.msg);
            CHECK(x.parallel.pp_schedule == l->schedule, "planner_apply writes the schedule");
            /* the search builds each (schedule, pp, vpp, micro-batches, recompute)'s activation
             * sets once and keeps them across meshes (sets_of) */
            CHECK(e[i].cost.mem_peak == plan_memory_peak(&x), "entry %ld: peak %.0f vs plan %.0f",
                  i, e[i].cost.mem_peak, plan_memory_peak(&x));
            CHECK(l->pp > 1 || (l->schedule == PP_1F1B && l->vpp == 1), "pp 1: 1f1b, got %s",
                  pps_kind_name(l->schedule));
            if (l->pp > 1) seen[l->schedule]++;
        }
        if (t == 0)
            CHECK(!seen[PP_ZB] && seen[PP_DUALPIPEV] + seen[PP_DUALPIPE] > 0,
                  "MoE: no zb (%ld), the dual pipes %ld + %ld", seen[PP_ZB], seen[PP_DUALPIPEV],
                  seen[PP_DUALPIPE]);
        else
            for (int k = PP_1F1B; k <= PP_DUALPIPE; k++)
                CHECK(seen[k] > 0, "dense: %s proposed %ld times", pps_kind_name(k), seen[k]);
        CHECK(!seen[PP_AFAB], "afab is never searched");
        free(e);
    }
}

/* Stages that do not divide the layers get them as evenly as they can, the extra ones on the
 * stages after the first: 61 layers on 16 stages is DeepSeek-V3's 3, 4 x 13, 3, 3. A search over
 * 6 layers on 4 ranks proposes pp 4 (1, 2, 2, 1), each valid with the memory plan of its split,
 * and interleaving only at a vpp whose stages divide the layers. */
static void test_uneven_stages_when_they_do_not_divide_the_layers() {
    ust_config c, x;
    tiny(&c);
    c.model.n_layer = 61;
    planner_layout l = LAYOUT(.pp = 16, .dp = 1);
    planner_apply(&c, &l, &x);
    CHECK(!strcmp(x.parallel.pp_layers, "3,4,4,4,4,4,4,4,4,4,4,4,4,4,3,3"), "61 on 16: %s",
          x.parallel.pp_layers);
    l = LAYOUT(.pp = 4, .vpp = 2, .schedule = PP_DUALPIPEV); /* 8 stages: 7, 8 x 6, 7 */
    planner_apply(&c, &l, &x);
    CHECK(!strcmp(x.parallel.pp_layers, "7,8,8,8,8,8,7,7"), "61 on 8: %s", x.parallel.pp_layers);
    c.model.n_layer = 64;
    planner_apply(&c, &l, &x);
    CHECK(!x.parallel.pp_layers[0], "an even split is left to the config: %s",
          x.parallel.pp_layers);
    tiny(&c);
    c.model.n_layer = 6, c.train.global_batch_size = 16;
    planner_hw hw = hw_of(450e9, 50e9, 8);
    planner_entry *e;
    planner_stats st;
    long n = planner_search(&c, 4, &hw, &e, &st), pp4 = 0;
    for (long i = 0; i < n; i++) {
        ust_config y;
        ust_err err;
        planner_apply(&c, &e[i].l, &y);
        CHECK(!cfg_validate(&y, 4, &err), "entry %ld: %s", i, err.msg);
        CHECK(e[i].cost.mem_peak == plan_memory_peak(&y), "entry %ld: the peak of its split", i);
        CHECK(e[i].l.schedule != PP_INTERLEAVED || 6 % (e[i].l.pp * e[i].l.vpp) == 0,
              "interleaved pp %d vpp %d", e[i].l.pp, e[i].l.vpp);
        if (e[i].l.pp == 4 && e[i].l.schedule == PP_1F1B) {
            pp4++;
            CHECK(!strcmp(y.parallel.pp_layers, "1,2,2,1"), "%s", y.parallel.pp_layers);
        }
    }
    CHECK(pp4 > 0, "pp 4 over 6 layers proposed (%ld fitting)", n);
    free(e);
}

/* Two layouts that differ only in the schedule (interleaved, dualpipev and dualpipe all run at
 * vpp 2) never tie, even at equal estimates, so qsort's result does not depend on the order the
 * search enumerated them in; per mesh only the better one is listed (the schedule is a variant of
 * the mesh, like the ZeRO stage). */
static void test_compare_and_mesh_dedup_with_schedules() {
    planner_entry a = {.l = LAYOUT(.pp = 2, .vpp = 2, .schedule = PP_INTERLEAVED)};
    a.cost.total = 1, a.cost.mem_peak = 1;
    planner_entry b = a, list[2];
    b.l.schedule = PP_DUALPIPEV;
    int ab = planner_compare(&a, &b), ba = planner_compare(&b, &a);
    CHECK(ab != 0 && sign(ab) == -sign(ba), "compare %d, %d", ab, ba);
    list[0] = ab < 0 ? a : b, list[1] = ab < 0 ? b : a;
    CHECK(planner_best_per_mesh(list, 2) == 1 && list[0].l.schedule == (ab < 0 ? a : b).l.schedule,
          "one entry per mesh, the first");
}

static void test_no_layout_of_a_prime_world() {
    ust_config c;
    tiny(&c);
    planner_hw hw = hw_of(450e9, 50e9, 8);
    planner_entry *e;
    planner_stats st;
    long n = planner_search(&c, 7, &hw, &e, &st);
    CHECK(n == 0 && st.candidates > 0 && st.invalid == st.candidates, "%ld of %ld", st.invalid,
          st.candidates);
    CHECK(strstr(st.first_error, "divisible") != NULL, "why: %s", st.first_error);
    free(e);
}

int main(void) {
    RUN_TEST(test_ring_formulas);
    RUN_TEST(test_group_is_intra_node_when_its_span_fits_and_divides_the_node);
    RUN_TEST(test_parameter_count_equals_the_memory_plans);
    RUN_TEST(test_flops_per_token_by_hand);
    RUN_TEST(test_flops_per_token_counts_each_window);
    RUN_TEST(test_flops_per_token_counts_mtp_modules);
    RUN_TEST(test_flops_per_token_equal_the_models);
    RUN_TEST(test_mixed_layers_count_on_the_rank_that_holds_them);
    RUN_TEST(test_compute_and_pipeline_bubble);
    RUN_TEST(test_moe_compute_splits_over_tp);
    RUN_TEST(test_dp_only_gradient_all_reduce);
    RUN_TEST(test_tp_volume_per_layer);
    RUN_TEST(test_cp_ring_kv_passes);
    RUN_TEST(test_cp_ring_routes_by_hand);
    RUN_TEST(test_cp_latent_ring_passes);
    RUN_TEST(test_pp_p2p_activations);
    RUN_TEST(test_ep_all_to_all);
    RUN_TEST(test_ranking_without_communication_cost);
    RUN_TEST(test_ranking_puts_the_pipeline_across_slow_nodes);
    RUN_TEST(test_memory_filter_and_best_per_mesh);
    RUN_TEST(test_dualpipe_estimate_includes_the_mirror_all_reduce);
    RUN_TEST(test_deep_pipeline_prefers_a_zero_bubble_schedule);
    RUN_TEST(test_planner_never_proposes_a_schedule_validate_refuses);
    RUN_TEST(test_compare_and_mesh_dedup_with_schedules);
    RUN_TEST(test_uneven_stages_when_they_do_not_divide_the_layers);
    RUN_TEST(test_no_layout_of_a_prime_world);
    return TEST_SUMMARY();
}
