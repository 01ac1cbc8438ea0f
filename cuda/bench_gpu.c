/* bench_gpu: times whole training steps (forward, backward, AdamW) of a model on the CUDA backend
 * and prints tokens/s and MFU, without the data loader or the step loop of core/train.
 * Usage: bench_gpu [B] [T] [steps] [fp32|bf16] [gpt2-124m|llama-tiny] [peak_tflops]
 * (defaults 8 1024 10 bf16 gpt2-124m 989: dense bf16 of H100/H200 SXM). FLOPs per token are the
 * model's own count (6 N_matmul + 12 L d T). Prints "SKIP bench_gpu: <why>" without a GPU.
 * bench_gpu attention [B] [T] [H] [D] [reps]: one causal attention forward + backward under bf16
 * with each implementation (UST_CUDA_ATTENTION = tc, gemm, flash), ms and TFLOP/s (causal
 * FLOPs: 4 B H T^2 D / 2 forward, 2.5x that backward with its recomputation not counted).
 * bench_gpu --model-only [B] [T]: no GPU needed; the roofline time of each op of a GPT-2 124M
 * bf16 step on an H200 from its FLOP and byte counts, and the expected MFU. fp32 runs report MFU
 * against the fp32 (non-TF32) peak, 67 TFLOP/s. */
#include "config.h"
#include "log.h"
#include "ops_cuda.h"
#include "mem.h"
#include "model.h"
#include "ops.h"
#include "ops_prof.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Times `reps` causal forward+backward passes of one attention implementation. */
/* n floats of host as activations at dst: as they are, or rounded to bf16 (nearest even) on the
 * host when the backend stores bf16 (act_size 2). */
static void upload_act(const ust_ops *o, act *dst, const float *host, size_t n) {
    if (o->act_size == 4) {
        o->to_device(o, dst, host, n * sizeof(float));
        return;
    }
    uint16_t *h16 = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &host[i], 4);
        h16[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    o->to_device(o, dst, h16, n * sizeof(uint16_t));
    free(h16);
}

static int bench_attention_mode(const char *mode, int B, int T, int H, int D, int reps) {
    setenv("UST_CUDA_ATTENTION", mode, 1);
    ust_err e;
    ust_ops *o = ops_cuda_create(0, &e);
    unsetenv("UST_CUDA_ATTENTION");
    if (!o) {
        printf("%s bench_gpu attention: %s\n", ops_cuda_gpu_required() ? "FAIL" : "SKIP", e.msg);
        return ops_cuda_gpu_required() ? -1 : 0;
    }
    ops_cuda_set_bf16(o, 1);
    size_t nq = (size_t)B * T * H * D, nl = (size_t)B * H * T;
    act *buf[8];
    for (int i = 0; i < 8; i++) buf[i] = o->alloc(o, act_bytes(o, (int64_t)nq));
    act *q = buf[0], *k = buf[1], *v = buf[2], *out = buf[3], *dout = buf[4], *dq = buf[5],
        *dk = buf[6], *dv = buf[7];
    float *lse = o->alloc(o, nl * sizeof(float)), *host = malloc(nq * sizeof(float));
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 5; i++) { /* q, k, v, out (overwritten), dout: uniform [-1, 1) */
        for (size_t j = 0; j < nq; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            host[j] = (float)((x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        }
        upload_act(o, buf[i], host, nq);
    }
    double fwd_flops = 4.0 * B * H * (double)T * T * D / 2, t[2] = {0, 0};
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (scratch, shared-memory opt-in) */
        double t0 = log_now_s();
        o->attention_fwd(o, out, lse, q, k, v, B, T, T, H, H, D, NULL, NULL, 1, NULL, 0.0f);
        o->sync(o);
        double t1 = log_now_s();
        o->attention_bwd(o, dq, dk, dv, dout, out, lse, q, k, v, B, T, T, H, H, D, NULL, NULL, 1,
                         NULL, 0.0f);
        o->sync(o);
        if (r >= 0) t[0] += t1 - t0, t[1] += log_now_s() - t1;
    }
    printf("bench_gpu attention %-5s B=%d T=%d H=%d D=%d: forward %.3f ms (%.1f TFLOP/s), "
           "backward %.3f ms (%.1f TFLOP/s)\n",
           mode, B, T, H, D, t[0] / reps * 1e3, fwd_flops * reps / t[0] / 1e12, t[1] / reps * 1e3,
           2.5 * fwd_flops * reps / t[1] / 1e12);
    for (int i = 0; i < 8; i++) o->free(o, buf[i]);
    o->free(o, lse);
    free(host);
    o->destroy(o);
    return 0;
}

static int bench_attention(int argc, char **argv) {
    int B = argc > 2 ? atoi(argv[2]) : 8, T = argc > 3 ? atoi(argv[3]) : 1024;
    int H = argc > 4 ? atoi(argv[4]) : 12, D = argc > 5 ? atoi(argv[5]) : 64;
    int reps = argc > 6 ? atoi(argv[6]) : 5;
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0 || reps <= 0) {
        fprintf(stderr, "usage: bench_gpu attention [B] [T] [H] [D] [reps]\n");
        return 2;
    }
    static const char *const modes[] = {"tc", "gemm", "flash"};
    for (int i = 0; i < 3; i++)
        if (bench_attention_mode(modes[i], B, T, H, D, reps) < 0) return 1; /* UST_REQUIRE_GPU */
    return 0;
}

#define BENCH_PEAK_BF16 989.0 /* TFLOP/s, H100/H200 SXM, dense bf16 */
#define BENCH_PEAK_FP32 67.0  /* TFLOP/s, H100/H200 SXM, fp32 without TF32 */

/* One training step (forward, backward, AdamW at step t) on B x T tokens; returns the mean loss. */
static double train_step(model *m, const ust_ops *o, const int32_t *in, const int32_t *tgt,
                         float *mom, float *var, int B, int T, int t) {
    int64_t ntok = 0, n = model_numel(m);
    int32_t *pos = malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) pos[i] = i % T;
    ust_batch b = {.tokens = in, .targets = tgt, .positions = pos};
    model_zero_grads(m);
    double loss = model_forward(m, &b, 1.0f / (B * T), &ntok) / (double)ntok;
    free(pos);
    model_backward(m);
    o->adamw(o, model_params(m), model_grads(m), mom, var, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f,
             t);
    return loss;
}

/* The benchmarked model: gpt2-124m (default) or llama-tiny, at micro-batch B of T tokens. */
static void bench_config(ust_config *c, const char *shape, int B, int T, int bf16) {
    cfg_defaults(c);
    if (strcmp(shape, "llama-tiny") == 0) {
        c->model.arch = ARCH_LLAMA;
        c->model.n_layer = 4, c->model.d_model = 256, c->model.n_head = 8, c->model.n_kv_head = 4;
        c->model.d_ff = 768, c->model.vocab_size = 512;
    } else {
        c->model.arch = ARCH_GPT2;
        c->model.n_layer = 12, c->model.d_model = 768, c->model.n_head = 12,
        c->model.n_kv_head = 12;
        c->model.d_ff = 3072, c->model.vocab_size = 50257;
    }
    c->model.max_seq_len = T;
    c->train.seq_len = T;
    c->train.micro_batch_size = B;
    c->train.global_batch_size = B;
    c->train.precision = bf16 ? PREC_BF16 : PREC_FP32;
}

/* n pseudo-random inputs and targets below vocab (xorshift64, a fixed seed). */
static void bench_tokens(int32_t *in, int32_t *tgt, int n, int vocab) {
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        in[i] = (int32_t)(x % (uint64_t)vocab);
        tgt[i] = (int32_t)((x >> 20) % (uint64_t)vocab);
    }
}

/* Times `steps` training steps after two warm-up ones and prints the throughput, then profiles
 * two more with the op profiler on. */
static void bench_steps(model *m, ust_ops *o, ust_ops *po, const ust_arena *arena, int32_t *in,
                        int32_t *tgt, float *mom, float *var, int B, int T, int steps,
                        double peak) {
    double t0 = 0.0, loss = 0.0;
    int warm = 2;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) {
            o->sync(o);
            t0 = log_now_s();
        }
        loss = train_step(m, po, in, tgt, mom, var, B, T, s + 1);
    }
    o->sync(o);
    double dt = log_now_s() - t0;
    ops_mem dm;
    o->memory(o, &dm);
    printf(
        "bench_gpu: device memory: arena %.2f GiB, backend scratch %.2f GiB, device used %.2f of "
        "%.2f GiB\n",
        arena->total / 1073741824.0, dm.backend_bytes / 1073741824.0, dm.device_used / 1073741824.0,
        dm.device_total / 1073741824.0);
    double tps = (double)B * T * steps / dt, flops = model_flops_per_token(m) * tps;
    printf(
        "bench_gpu: %d steps in %.3f s: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of "
        "%.0f TFLOP/s (last loss %.4f)\n",
        steps, dt, dt / steps * 1e3, tps, flops / 1e12, 100.0 * flops / peak, peak / 1e12, loss);
    const int prof_steps = 2;
    ops_prof_enable(po, 1);
    for (int s = 0; s < prof_steps; s++)
        train_step(m, po, in, tgt, mom, var, B, T, warm + steps + s + 1);
    printf("bench_gpu: where a step's time goes (%d more steps, each op between two syncs; a "
           "sync and launch cost ~5-10 us each, so small ops read high and the total exceeds "
           "the timed step):\n",
           prof_steps);
    ops_prof_print(po, stdout, prof_steps);
}

/* ---- bench_gpu --model-only: the roofline of a step, before any GPU is seen ----------------- */

#define BENCH_HBM_TBS 4.8 /* H200 HBM3e, TB/s */

typedef struct {
    const char *name;
    double calls, flops, bytes; /* per step */
} roof_op;

typedef struct {
    roof_op op[16];
    int n;
} roof_table;

static void roof_add(roof_table *t, const char *name, double calls, double flops, double bytes) {
    t->op[t->n++] = (roof_op){name, calls, flops, bytes};
}

/* seconds of op at the roofline: the larger of its FLOPs at peak and its bytes at the HBM rate;
 * gemm_eff / mem_eff scale the two peaks to what kernels reach in practice */
static double roof_time(const roof_op *o, double peak, double gemm_eff, double mem_eff) {
    double tc = o->flops / (peak * gemm_eff), tm = o->bytes / (BENCH_HBM_TBS * 1e12 * mem_eff);
    return tc > tm ? tc : tm;
}

/* The ops of one training step of a GPT-2 shape (c->model) at B x T in bf16, as the CUDA backend
 * runs them: GEMMs through cuBLASLt with bf16 activations and the bf16 copy of the weights that
 * AdamW writes as it updates the fp32 master weights (2 B more per parameter, once per step),
 * GELU fused into the fc GEMM's epilogue (its input kept for the backward), the tensor-core
 * flash attention (causal: half of the T^2 tiles; the backward computes 7 tile products per
 * tile where the forward computes 2, or 5 under run.deterministic: false, which also zeroes,
 * reads and writes an fp32 copy of dq: its atomics are counted as L2 traffic, not HBM), fused
 * cross-entropy forward+backward over the logits, and AdamW over fp32 parameters, gradients and
 * moments and that copy (30 B per parameter). */
static void roof_gpt2(roof_table *t, const ust_config *c, int B, int T) {
    const double L = c->model.n_layer, d = c->model.d_model, ff = c->model.d_ff,
                 V = c->model.vocab_size, H = c->model.n_head, N = (double)B * T, a = 2;
    const double Pl = 4 * d * d + 2 * d * ff, P = L * (Pl + 4 * d + 4 * d + ff) + V * d + T * d;
    const double att = 2.0 * B * H * (double)T * T * (d / H); /* causal: 4 B H T^2 hd / 2 */
    /* activations a linear layer reads and writes per token, forward: qkv, proj, fc, fc-proj */
    const double lin_act = (d + 3 * d) + (d + d) + (d + 2 * ff) + (ff + d);
    roof_add(t, "layernorm_fwd", 2 * L + 1, 8 * N * d * (2 * L + 1),
             (2 * L + 1) * (2 * N * d * a + 8 * N));
    roof_add(t, "matmul_fwd", 4 * L, 2 * N * L * Pl, L * (N * lin_act * a + Pl * a));
    roof_add(t, "attention_fwd", L, L * att, L * (4 * N * d * a + 4 * N * H));
    roof_add(t, "residual_add", 4 * L, N * d * 4 * L, 4 * L * 3 * N * d * a);
    roof_add(t, "lm_head_fwd", 1, 2 * N * d * V, N * d * a + V * d * a + N * V * a);
    /* k_xent reads the logits twice (max and sum in one online pass, then the gradient) and
     * writes the gradient once */
    roof_add(t, "xent_fwd_bwd", 1, 5 * N * V, 3 * N * V * a);
    roof_add(t, "lm_head_bwd", 2, 4 * N * d * V, 2 * N * V * a + V * d * (a + 8) + 2 * N * d * a);
    roof_add(t, "matmul_bwd", 8 * L, 4 * N * L * Pl, L * (2 * N * lin_act * a + Pl * (a + 8)));
    const double bwd_products = c->run.deterministic ? 7 : 5;
    roof_add(t, "attention_bwd", L, bwd_products / 2 * L * att,
             L * (8 * N * d * a + 4 * N * H + (c->run.deterministic ? 0 : 12 * N * d)));
    roof_add(t, "layernorm_bwd", 2 * L + 1, 10 * N * d * (2 * L + 1), (2 * L + 1) * 3 * N * d * a);
    roof_add(t, "embedding", 2, 0, 2 * N * d * (a + 4) + T * d * 8);
    /* the embedding backward sorts its rows by destination (ops_cuda.cu emb_sort), per table: the
     * keys written and read back by the sum, a tile sort, and per merge above the 2048-key tile
     * its global passes and a tile pass, each reading and writing every 8-byte key */
    double n = 2, tile, sweeps = 1, launches = 3;
    while (n < N) n *= 2;
    tile = n < 2048 ? n : 2048;
    for (double k = 2 * tile; k <= n; k *= 2, sweeps++, launches++)
        for (double j = k / 2; j >= tile; j /= 2) sweeps++, launches++;
    roof_add(t, "embedding_sort", 2 * launches, 0, 2 * (16 * n + 16 * n * sweeps));
    roof_add(t, "adamw", 1, 10 * P, 30 * P);
}

/* The step again with run.deterministic: false (FlashAttention-2's 5-product attention backward):
 * what the opt-in would save at the realistic efficiencies, against `real` seconds. */
static void roof_nondeterministic(ust_config *c, int B, int T, double peak, double model_flops,
                                  double real) {
    roof_table t = {.n = 0};
    c->run.deterministic = false;
    roof_gpt2(&t, c, B, T);
    c->run.deterministic = true;
    double q = 0, att = 0;
    for (int i = 0; i < t.n; i++) {
        q += roof_time(&t.op[i], peak, 0.7, 0.8);
        if (strcmp(t.op[i].name, "attention_bwd") == 0) att = roof_time(&t.op[i], peak, 0.7, 0.8);
    }
    printf("bench_gpu --model-only: with run.deterministic: false (5 attention backward products, "
           "not 7; dq by fp32 atomics, not bit-reproducible): attention_bwd %.1f us, %.2f ms/step "
           "(%.2f ms less), MFU %.1f%% at realistic efficiencies\n",
           att * 1e6, q * 1e3, (real - q) * 1e3, 100 * model_flops / q / peak);
}

static int bench_model_only(int argc, char **argv) {
    int B = argc > 2 ? atoi(argv[2]) : 8, T = argc > 3 ? atoi(argv[3]) : 1024;
    if (B <= 0 || T <= 0) {
        fprintf(stderr, "usage: bench_gpu --model-only [B] [T]\n");
        return 2;
    }
    ust_config c;
    bench_config(&c, "gpt2-124m", B, T, 1);
    roof_table t = {.n = 0};
    roof_gpt2(&t, &c, B, T);
    const double peak = BENCH_PEAK_BF16 * 1e12, L = c.model.n_layer, d = c.model.d_model;
    const double nm = L * (4 * d * d + 2 * d * c.model.d_ff) + (double)c.model.vocab_size * d;
    const double model_flops = (6 * nm + 12 * L * d * T) * B * T; /* as model_flops_per_token */
    printf("bench_gpu --model-only: GPT-2 124M, B=%d T=%d bf16, one training step on an H200 "
           "(%.0f TFLOP/s dense bf16, %.1f TB/s HBM)\n%-14s %6s %9s %9s %9s %9s  bound\n",
           B, T, BENCH_PEAK_BF16, BENCH_HBM_TBS, "op", "calls", "GFLOP", "MB", "roof us",
           "real us");
    double roof = 0, real = 0;
    for (int i = 0; i < t.n; i++) {
        const roof_op *o = &t.op[i];
        double r = roof_time(o, peak, 1, 1), q = roof_time(o, peak, 0.7, 0.8);
        roof += r, real += q;
        int mem = o->bytes / (BENCH_HBM_TBS * 1e12) > o->flops / peak;
        printf("%-14s %6.0f %9.1f %9.1f %9.1f %9.1f  %s\n", o->name, o->calls, o->flops / 1e9,
               o->bytes / 1e6, r * 1e6, q * 1e6, mem ? "memory" : "compute");
    }
    printf("(real: GEMMs and attention at 70%% of the peak, memory-bound ops at 80%% of the HBM "
           "rate, as tuned kernels reach; launch gaps and host time not counted)\n");
    printf("bench_gpu --model-only: expected %.2f ms/step, MFU %.1f%% at the roofline; %.2f "
           "ms/step, MFU %.1f%% at realistic efficiencies (%.3g model FLOPs/step)\n",
           roof * 1e3, 100 * model_flops / roof / peak, real * 1e3, 100 * model_flops / real / peak,
           model_flops);
    roof_nondeterministic(&c, B, T, peak, model_flops, real);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "attention") == 0) return bench_attention(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--model-only") == 0) return bench_model_only(argc, argv);
    int B = argc > 1 ? atoi(argv[1]) : 8, T = argc > 2 ? atoi(argv[2]) : 1024;
    int steps = argc > 3 ? atoi(argv[3]) : 10;
    int bf16 = argc > 4 ? strcmp(argv[4], "fp32") != 0 : 1;
    const char *shape = argc > 5 ? argv[5] : "gpt2-124m";
    /* MFU against the peak of the arithmetic used: H100/H200 SXM dense bf16 tensor cores 989
     * TFLOP/s; fp32 runs plain SGEMM (no TF32), whose peak is the CUDA cores' 67 TFLOP/s */
    double peak = (argc > 6 ? atof(argv[6]) : bf16 ? BENCH_PEAK_BF16 : BENCH_PEAK_FP32) * 1e12;
    if (B <= 0 || T <= 0 || steps <= 0) {
        fprintf(
            stderr,
            "usage: bench_gpu [B] [T] [steps] [fp32|bf16] [gpt2-124m|llama-tiny] [peak_tflops]\n");
        return 2;
    }

    ust_config c;
    bench_config(&c, shape, B, T, bf16);

    ust_err e;
    ust_ops *o = ops_cuda_create(0, &e);
    if (!o) {
        printf("%s bench_gpu: %s\n", ops_cuda_gpu_required() ? "FAIL" : "SKIP", e.msg);
        return ops_cuda_gpu_required() ? 1 : 0;
    }
    int drv, rt;
    ops_cuda_versions(&drv, &rt);
    printf("# CUDA driver %d.%d, runtime %d.%d\n", drv / 1000, drv % 1000 / 10, rt / 1000,
           rt % 1000 / 10);
    ops_cuda_set_bf16(o, bf16);
    /* the model runs through the op profiler, off while timing (one indirect call more per op) */
    ust_ops *po = ops_prof_create(o);
    ust_arena arena;
    mem_init(&arena, po);
    model *m = NULL;
    if (model_create(&m, &c, po, &arena, &e)) {
        fprintf(stderr, "bench_gpu: model_create: %s\n", e.msg);
        return 2;
    }
    model_init_params(m, 1234);
    int64_t n = model_numel(m);
    float *mom = po->alloc(po, (size_t)n * sizeof(float)),
          *var = po->alloc(po, (size_t)n * sizeof(float));
    int32_t *in = malloc((size_t)B * T * sizeof(int32_t)),
            *tgt = malloc((size_t)B * T * sizeof(int32_t));
    bench_tokens(in, tgt, B * T, c.model.vocab_size);
    printf("bench_gpu: %s B=%d T=%d %s, %lld parameters, %.3g FLOP/token, arena %.2f GiB\n", shape,
           B, T, bf16 ? "bf16 (activations, matmuls)" : "fp32", (long long)n,
           model_flops_per_token(m), arena.total / 1073741824.0);
    bench_steps(m, o, po, &arena, in, tgt, mom, var, B, T, steps, peak);
    free(in);
    free(tgt);
    o->free(o, mom);
    o->free(o, var);
    model_destroy(m);
    mem_release(&arena);
    po->destroy(po);
    o->destroy(o);
    return 0;
}
