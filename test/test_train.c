/* The step loop's pure parts and its accounting: learning-rate schedules, clipping, the memory
 * plan against the arena a real run allocates, gradient accumulation, and the NaN guard. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "data.h"
#include "optim.h"
#include "plan.h"
#include "train.h"
#include "test.h"

static char g_dir[256];

static void base_config(ust_config *c) {
    cfg_defaults(c);
    c->model.n_layer = 2;
    c->model.d_model = 64;
    c->model.n_head = 4;
    c->model.n_kv_head = 2;
    c->model.d_ff = 96;
    c->train.steps = 3;
    c->train.seq_len = 32;
    c->train.micro_batch_size = 2;
    c->train.global_batch_size = 4;
    c->train.threads = 1;
    c->checkpoint.every = 0;
    snprintf(c->checkpoint.resume, sizeof c->checkpoint.resume, "none");
    snprintf(c->data.train, sizeof c->data.train, "%s/train_*.bin", g_dir);
    snprintf(c->data.val, sizeof c->data.val, "%s/val_*.bin", g_dir);
    c->logging.metrics_file[0] = 0;
    c->logging.peak_flops = 1e12;
}

/* optimizer.embed / norm: a group's own shape (schedule, warmup, floor) at its own peak, and
 * without one the optimizer's shape scaled to the peak, bit for bit the run's rate when the peak
 * is lr. */
static void test_group_lr_has_its_own_shape(void) {
    ust_config c;
    cfg_defaults(&c);
    c.train.steps = 100;
    c.optimizer.warmup_steps = 10;
    c.optimizer.lr = 1.0;
    c.optimizer.min_lr = 0.1;
    c.optimizer.embed_lr = 0.5;
    for (int64_t s = 0; s < 100; s += 7) {
        CHECK(optim_group_lr(&c, OPTIM_GROUP_REST, s) == optim_lr(&c, s), "rest at step %lld",
              (long long)s);
        CHECK(optim_group_lr(&c, OPTIM_GROUP_NORM, s) == optim_lr(&c, s), "norm at step %lld",
              (long long)s);
        CHECK_CLOSE(optim_group_lr(&c, OPTIM_GROUP_EMBED, s), 0.5 * optim_lr(&c, s), 1e-15, 0,
                    "embed scaled");
    }
    c.optimizer.embed.schedule = SCHED_CONSTANT; /* constant at 0.5 after no warmup */
    c.optimizer.embed.warmup_steps = 0;
    CHECK_CLOSE(optim_group_lr(&c, OPTIM_GROUP_EMBED, 0), 0.5, 1e-15, 0, "embed, no warmup");
    CHECK_CLOSE(optim_group_lr(&c, OPTIM_GROUP_EMBED, 99), 0.5, 1e-15, 0, "embed constant");
    c.optimizer.norm.warmup_steps = 5; /* cosine from step 5 to its own floor */
    c.optimizer.norm.min_lr = 0.0;
    CHECK_CLOSE(optim_group_lr(&c, OPTIM_GROUP_NORM, 1), 0.4, 1e-15, 0, "norm warmup 2 of 5");
    CHECK_CLOSE(optim_group_lr(&c, OPTIM_GROUP_NORM, 99), 0.0, 1e-15, 0, "norm floor");
    CHECK_CLOSE(optim_group_lr(&c, OPTIM_GROUP_NORM, 5 + 47), 0.5, 1e-12, 0,
                "norm cosine midpoint");
    CHECK_CLOSE(optim_lr(&c, 99), 0.1, 1e-12, 0, "the optimizer's own shape unchanged");
    /* weight decay: the optimizer's, a group's own, the norms' none by default */
    c.optimizer.weight_decay = 0.1;
    CHECK(optim_group_wd(&c, OPTIM_GROUP_EMBED) == 0.1 && optim_group_wd(&c, OPTIM_GROUP_NORM) == 0,
          "default weight decays");
    c.optimizer.embed.weight_decay = 0.0;
    c.optimizer.norm.weight_decay = 0.05;
    CHECK(optim_group_wd(&c, OPTIM_GROUP_EMBED) == 0 &&
              optim_group_wd(&c, OPTIM_GROUP_NORM) == 0.05 &&
              optim_group_wd(&c, OPTIM_GROUP_REST) == 0.1,
          "group weight decays");
}

static void test_lr_warmup_then_cosine_to_min_lr(void) {
    ust_config c;
    cfg_defaults(&c);
    c.train.steps = 100;
    c.optimizer.warmup_steps = 10;
    c.optimizer.lr = 1.0;
    c.optimizer.min_lr = 0.1;
    CHECK_CLOSE(optim_lr(&c, 0), 0.1, 1e-12, 0, "first warmup step");
    CHECK_CLOSE(optim_lr(&c, 9), 1.0, 1e-12, 0, "end of warmup");
    CHECK_CLOSE(optim_lr(&c, 99), 0.1, 1e-12, 0, "cosine ends at min_lr");
    /* halfway through the decay the cosine is at the midpoint */
    double mid = optim_lr(&c, 10 + 89 / 2.0);
    CHECK(mid > 0.5 && mid < 0.6, "cosine midpoint %g", mid);
    c.optimizer.schedule = SCHED_LINEAR;
    CHECK_CLOSE(optim_lr(&c, 10 + 89), 0.1, 1e-12, 0, "linear end");
    CHECK_CLOSE(optim_lr(&c, 10), 1.0, 1e-12, 0, "linear start");
    c.optimizer.schedule = SCHED_CONSTANT;
    CHECK_CLOSE(optim_lr(&c, 77), 1.0, 1e-12, 0, "constant");
    c.optimizer.schedule = SCHED_WSD;
    c.optimizer.decay_frac = 0.2; /* the last 20 steps decay linearly */
    CHECK_CLOSE(optim_lr(&c, 79), 1.0, 1e-12, 0, "wsd stable phase");
    CHECK_CLOSE(optim_lr(&c, 80), 1.0, 1e-12, 0, "wsd decay starts");
    CHECK_CLOSE(optim_lr(&c, 99), 0.1, 1e-12, 0, "wsd ends at min_lr");
}

static void test_clip_scale_brings_the_norm_to_grad_clip(void) {
    ust_config c;
    cfg_defaults(&c);
    c.train.grad_clip = 1.0;
    CHECK_CLOSE(optim_clip_scale(&c, 0.5), 1.0, 0, 0, "below the threshold");
    CHECK_CLOSE(4.0 * optim_clip_scale(&c, 4.0), 1.0, 1e-6, 0, "clipped norm");
    c.train.grad_clip = 0;
    CHECK_CLOSE(optim_clip_scale(&c, 100.0), 1.0, 0, 0, "clipping off");
}

/* The plan is closed-form from the config; the arena is what the run allocated. They must
 * agree to within the tensors' 64-byte alignment padding (well under 1%). */
static void check_plan(ust_arch arch, ust_recompute rc) {
    ust_config c;
    base_config(&c);
    c.model.arch = arch;
    c.model.n_kv_head = arch == ARCH_GPT2 ? 4 : 2;
    c.train.recompute = rc;
    c.train.steps = 1;
    mem_plan p;
    plan_memory(&c, &p);
    train_opts o = {.quiet = 1};
    train_result r;
    int code = train_run(&c, NULL, &o, &r);
    CHECK(code == 0, "train_run exit %d", code);
    CHECK_CLOSE(r.arena_by_cat[0], p.params, 0, 0.01, "parameter bytes vs plan");
    CHECK_CLOSE(r.arena_by_cat[1], p.grads, 0, 0.01, "gradient bytes vs plan");
    CHECK_CLOSE(r.arena_by_cat[2], p.optim, 0, 0.01, "optimizer bytes vs plan");
    CHECK_CLOSE(r.arena_by_cat[3], p.acts, 0, 0.01, "activation bytes vs plan");
}

static void test_memory_plan_matches_the_arena_gpt2(void) { check_plan(ARCH_GPT2, RECOMPUTE_NONE); }
static void test_memory_plan_matches_the_arena_llama(void) {
    check_plan(ARCH_LLAMA, RECOMPUTE_NONE);
}
static void test_memory_plan_matches_the_arena_selective(void) {
    check_plan(ARCH_LLAMA, RECOMPUTE_SELECTIVE);
}
static void test_memory_plan_matches_the_arena_full(void) { check_plan(ARCH_GPT2, RECOMPUTE_FULL); }

/* global batch 4 as 1 micro-batch of 4 or 4 micro-batches of 1: the same samples, the same mean
 * loss; only the summation order differs (fp32, ~1e-6 relative). */
static void test_gradient_accumulation_matches_one_big_batch(void) {
    ust_config a, b;
    base_config(&a);
    a.train.micro_batch_size = 4;
    base_config(&b);
    b.train.micro_batch_size = 1;
    train_opts o = {.quiet = 1};
    train_result ra, rb;
    CHECK(train_run(&a, NULL, &o, &ra) == 0 && train_run(&b, NULL, &o, &rb) == 0, "runs failed");
    CHECK_CLOSE(rb.final_loss, ra.final_loss, 0, 2e-5, "loss after 3 steps, accum 4 vs 1");
}

static void test_non_finite_loss_stops_with_exit_1(void) {
    ust_config c;
    base_config(&c);
    c.optimizer.lr = 1e30; /* the first update blows the weights up */
    c.optimizer.warmup_steps = 0;
    c.train.grad_clip = 0;
    train_opts o = {.quiet = 1};
    train_result r;
    fflush(stdout);
    int code = train_run(&c, NULL, &o, &r);
    CHECK(code == 1, "exit %d, expected 1", code);
    c.train.on_nan = ONNAN_SKIP;
    code = train_run(&c, NULL, &o, &r);
    CHECK(code == 0 && r.steps_done == 3, "on_nan skip: exit %d after %lld steps", code,
          (long long)r.steps_done);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ustrain-test-train.%d", (int)getpid());
    ust_err e;
    if (data_write_demo(g_dir, &e)) {
        printf("FAIL setup: %s\n", e.msg);
        return 1;
    }
    RUN_TEST(test_lr_warmup_then_cosine_to_min_lr);
    RUN_TEST(test_group_lr_has_its_own_shape);
    RUN_TEST(test_clip_scale_brings_the_norm_to_grad_clip);
    RUN_TEST(test_memory_plan_matches_the_arena_gpt2);
    RUN_TEST(test_memory_plan_matches_the_arena_llama);
    RUN_TEST(test_memory_plan_matches_the_arena_selective);
    RUN_TEST(test_memory_plan_matches_the_arena_full);
    RUN_TEST(test_gradient_accumulation_matches_one_big_batch);
    RUN_TEST(test_non_finite_loss_stops_with_exit_1);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) printf("# could not remove %s\n", g_dir);
    return TEST_SUMMARY();
}
