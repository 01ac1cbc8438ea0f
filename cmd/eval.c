/* ustrain eval CKPT_OR_HF_DIR --data GLOB [--steps N] [--seq-len T] [--micro-batch-size B]
 * [--set key=value ...]: the mean loss and perplexity of a model over the windows of GLOB.
 *
 * The run is the checkpoint's own config (state.json) with the overrides, evaluated by the
 * trainer's validation pass (train_eval), so any layout under any launcher gives the numbers one
 * process gives. A Hugging Face model directory goes through model.init_from with model.arch:
 * auto on the default config (core/hf_import reads its config.json and its weights). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "cmd.h"
#include "hf_import.h"
#include "config.h"
#include "data.h"
#include "error.h"
#include "eval_task.h"
#include "log.h"
#include "prep.h"
#include "train.h"

static const char *EVAL_USAGE =
    "usage: ustrain eval CKPT_OR_HF_DIR --data GLOB [--steps N] [--seq-len T]\n"
    "                    [--micro-batch-size B] [--set key.path=value ...]\n"
    "  mean loss and perplexity of the model over the windows of T+1 tokens of GLOB (shards in\n"
    "  data.format, the checkpoint's); prints `eval: loss X ppl Y tokens Z`.\n"
    "  CKPT_OR_HF_DIR  a checkpoint step directory or checkpoint directory (its newest step;\n"
    "                  the run's config comes from its state.json), or a Hugging Face model\n"
    "                  directory (read through model.init_from with model.arch: auto)\n"
    "  --steps N       micro-batches to evaluate, 1..1000000 (default: every whole micro-batch\n"
    "                  of GLOB; more than GLOB holds is an error)\n"
    "  --seq-len T     tokens per window (default: the run's train.seq_len; <= max_seq_len)\n"
    "  --micro-batch-size B  windows per micro-batch (default: the run's)\n"
    "  --set           any config key, e.g. --set parallel.tp=2 under scripts/ustrun: every\n"
    "                  layout gives the numbers of one process\n"
    "       ustrain eval CKPT_OR_HF_DIR --task FILE.jsonl [--tokenizer tokenizer.json|bytes]\n"
    "                    [--scores OUT.jsonl] [--seq-len T] [--micro-batch-size B] [--set ...]\n"
    "  multiple choice: items {context, choices, label} (or llm.c's HellaSwag {ctx, endings,\n"
    "  label}) scored by each choice's log-likelihood after the context, B choices per\n"
    "  micro-batch; prints acc, acc_norm (per character) and loglik (the right choices' mean);\n"
    "  --tokenizer defaults to the model directory's tokenizer.json\n";

typedef struct {
    const char *model, *data, *task, *tokenizer, *scores;
    long long steps, seq_len, mb; /* 0: not given */
} eval_args;

static int eval_usage(const char *fmt, const char *arg) {
    return cmd_usage_error("ustrain", EVAL_USAGE, fmt, arg);
}

static int parse_args(int argc, char **argv, eval_args *a) {
    const cmd_who who = {"ustrain", EVAL_USAGE};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (o[0] != '-') {
            if (a->model) return eval_usage("unexpected argument %s", o);
            a->model = o;
            continue;
        }
        if (strcmp(o, "--data") && strcmp(o, "--steps") && strcmp(o, "--seq-len") &&
            strcmp(o, "--micro-batch-size") && strcmp(o, "--set") && strcmp(o, "--task") &&
            strcmp(o, "--tokenizer") && strcmp(o, "--scores"))
            return eval_usage("unknown option %s for eval", o);
        if (i + 1 >= argc) return eval_usage("%s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--set") && cmd_set_arg(&who, argc, argv, i)) return UST_EXIT_USAGE;
        int rc = 0;
        if (!strcmp(o, "--data"))
            a->data = v;
        else if (!strcmp(o, "--task"))
            a->task = v;
        else if (!strcmp(o, "--tokenizer"))
            a->tokenizer = v;
        else if (!strcmp(o, "--scores"))
            a->scores = v;
        else if (!strcmp(o, "--steps"))
            rc = cmd_int_opt(&who, o, v, 1, 1000000, &a->steps);
        else if (!strcmp(o, "--seq-len"))
            rc = cmd_int_opt(&who, o, v, 1, 16777216, &a->seq_len);
        else if (!strcmp(o, "--micro-batch-size"))
            rc = cmd_int_opt(&who, o, v, 1, 1 << 20, &a->mb);
        if (rc) return rc;
    }
    if (!a->model) return eval_usage("%s", "missing CKPT_OR_HF_DIR");
    if (!a->data && !a->task) return eval_usage("%s", "missing --data GLOB (or --task FILE)");
    if (a->data && a->task) return eval_usage("%s", "--data and --task: one or the other");
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The model: a checkpoint's config, or a Hugging Face directory through model.init_from */

/* The run's config from state.json, and its step (the resume must not exceed train.steps). */
static int checkpoint_config(ust_config *c, const char *step, long long *at, ust_err *e) {
    ckpt_reader *r = ckpt_open(step, e);
    if (!r) return -1;
    cJSON *j = cJSON_Parse(ckpt_state_json(r));
    ckpt_close(r);
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(j, "config"),
                *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s/state.json (config)", step);
    int rc = cJSON_IsString(y) && cJSON_IsNumber(s)
                 ? cfg_load_string(c, y->valuestring, where, e)
                 : ust_errf(e, "eval: %s/state.json is not a ustrain checkpoint state", step);
    if (!rc) *at = (long long)s->valuedouble;
    /* a checkpoint is layout-free (docs/checkpoints.md): the layout is the world eval runs in
     * (the defaults, then --set parallel.*), never the one the run trained under */
    ust_config d;
    cfg_defaults(&d);
    c->parallel = d.parallel;
    cJSON_Delete(j);
    return rc;
}

static bool is_file(const char *dir, const char *name) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* A transformers model directory on the default config: the Hugging Face import reads its
 * config.json and weights through model.init_from (model.arch: auto takes its architecture). */
static int hf_model_config(ust_config *c, const char *dir, ust_err *e) {
    char set[PATH_MAX + 32];
    snprintf(set, sizeof set, "model.init_from=%s", dir);
    ust_err why;
    if (cfg_set(c, "model.arch=auto", &why) || cfg_set(c, set, &why) ||
        cfg_set(c, "checkpoint.resume=none", &why))
        return ust_errf(e,
                        "eval: %s is a Hugging Face model directory, read through "
                        "model.init_from with model.arch: auto: %s",
                        dir, why.msg);
    if (hf_resolve_config(c, e)) return -1; /* the shape from its config.json */
    /* the default sequence (128) may be longer than a small model's positions */
    if (c->train.seq_len > c->model.max_seq_len) c->train.seq_len = c->model.max_seq_len;
    return 0;
}

/* c: the config to evaluate with, before the overrides. */
static int model_config(ust_config *c, const char *model, ust_err *e) {
    struct stat st;
    char step[PATH_MAX] = "";
    long long at = 0;
    cfg_defaults(c);
    if (stat(model, &st) != 0) return ust_errf(e, "eval: %s: %s", model, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ust_errf(e, "eval: %s is not a checkpoint or Hugging Face model directory", model);
    if (is_file(model, "state.json")) {
        snprintf(step, sizeof step, "%s", model);
    } else if (is_file(model, "config.json")) {
        return hf_model_config(c, model, e);
    } else {
        int found = ckpt_find_latest(model, step, sizeof step, e);
        if (found < 0) return -1;
        if (!found)
            return ust_errf(e,
                            "eval: %s is neither a checkpoint (no state.json, no finished step_N) "
                            "nor a Hugging Face model directory (no config.json)",
                            model);
        /* the newest step that verifies (the run verifies the one named again, on every rank) */
        if (ckpt_resolve_step(model, "eval", step, sizeof step, e)) return -1;
    }
    if (checkpoint_config(c, step, &at, e)) return -1;
    /* the model only: resumed from this step, read-only (no lock, nothing written) */
    snprintf(c->checkpoint.resume, sizeof c->checkpoint.resume, "%s", step);
    if (c->train.steps < at) c->train.steps = at;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The overrides and the data */

static int apply_overrides(ust_config *c, int argc, char **argv, const eval_args *a, ust_err *e) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--set") && cfg_set(c, argv[++i], e)) return -1;
    if (strlen(a->data) >= sizeof c->data.val)
        return ust_errf(e, "eval: --data %s: longer than %zu characters", a->data,
                        sizeof c->data.val - 1);
    /* the run must open a training set too: GLOB, and the resume must accept it in place of the
     * checkpoint's blend (nothing is trained from it) */
    snprintf(c->data.train, sizeof c->data.train, "%s", a->data);
    snprintf(c->data.val, sizeof c->data.val, "%s", a->data);
    c->data.allow_reweight = true;
    if (a->seq_len && a->seq_len > c->model.max_seq_len)
        return ust_errf(e, "eval: --seq-len %lld is beyond the model's max_seq_len %d", a->seq_len,
                        c->model.max_seq_len);
    if (a->seq_len) c->train.seq_len = (int)a->seq_len;
    if (a->mb) c->train.micro_batch_size = (int)a->mb;
    /* the training step's batch only has to fit the layout: the fewest micro-batches per step
     * (interleaved needs a multiple of pp, dualpipev and dualpipe 2 * pp), so the pipeline holds
     * the fewest */
    int accum = c->parallel.pp == 1                         ? 1
                : c->parallel.pp_schedule == PP_INTERLEAVED ? c->parallel.pp
                : c->parallel.pp_schedule == PP_DUALPIPEV || c->parallel.pp_schedule == PP_DUALPIPE
                    ? 2 * c->parallel.pp
                    : 1;
    c->train.global_batch_size = c->train.micro_batch_size * c->parallel.dp * accum;
    c->data.val_every = 1;
    return 0;
}

/* The micro-batches to evaluate: --steps, or every whole one GLOB holds (and no more, since more
 * would count windows twice). */
static int eval_steps(const ust_config *c, const eval_args *a, int *steps, ust_err *e) {
    ust_dataset *d;
    int T = c->train.seq_len, B = c->train.micro_batch_size;
    if (data_open(&d, a->data, c->data.format, c->model.vocab_size, e)) return -1;
    data_meta meta = {0};
    data_pack_stats st;
    int eot = c->data.eot_id;
    if (c->data.packing && eot < 0 && data_meta_read(a->data, &meta, e) >= 0) eot = meta.eot_id;
    if (c->data.packing &&
        data_pack(d, T, eot, c->data.pack_buffer, c->data.overlong == 1, &st, e)) {
        data_close(d);
        return -1;
    }
    int64_t windows = data_num_samples(d, T), have = windows / B;
    data_close(d);
    if (have < 1)
        return ust_errf(e,
                        "eval: --data %s holds %lld windows of %d+1 tokens, fewer than one "
                        "micro-batch of %d",
                        a->data, (long long)windows, T, B);
    if (a->steps > have)
        return ust_errf(e,
                        "eval: --steps %lld: --data %s holds %lld micro-batches of %d windows of "
                        "%d+1 tokens",
                        a->steps, a->data, (long long)have, B, T);
    *steps = a->steps ? (int)a->steps : (int)(have < 1000000 ? have : 1000000);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Multiple choice: every (item, choice) an example alone at the start of a window, B windows per
 * micro-batch (core/train/train_task.h; any layout: the numbers of one process, and those of
 * eval.tasks during the training run at this checkpoint). */

/* The tokenizer a checkpoint's state.json records (the training data's, as export ships it). */
static void recorded_tokenizer(const ust_config *c, char *out, size_t cap) {
    ust_err ignored;
    ckpt_reader *r =
        strcmp(c->checkpoint.resume, "none") ? ckpt_open(c->checkpoint.resume, &ignored) : NULL;
    cJSON *j = r ? cJSON_Parse(ckpt_state_json(r)) : NULL;
    if (r) ckpt_close(r);
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(j, "tokenizer"),
                *p = cJSON_GetObjectItemCaseSensitive(rec, "path");
    if (cJSON_IsString(p)) snprintf(out, cap, "%s", p->valuestring);
    cJSON_Delete(j);
}

/* --tokenizer, else the model directory's tokenizer.json, else the checkpoint's record. */
static int task_tokenizer(const eval_args *a, const ust_config *c, tok_tokenizer **tok,
                          ust_err *e) {
    char p[PATH_MAX + 32] = "";
    if (a->tokenizer) snprintf(p, sizeof p, "%s", a->tokenizer);
    if (!p[0] && is_file(a->model, "tokenizer.json"))
        snprintf(p, sizeof p, "%s/tokenizer.json", a->model);
    if (!p[0]) recorded_tokenizer(c, p, sizeof p);
    if (!p[0])
        return ust_errf(e,
                        "eval: --task needs --tokenizer (no %s/tokenizer.json, and the checkpoint "
                        "records none)",
                        a->model);
    if (!strcmp(p, "bytes")) return *tok = tok_bytes(), 0;
    return tok_load(tok, p, e);
}

/* The run needs datasets to open: DIR/train_000.bin, the examples (their ids checked against
 * the model's vocabulary) then a micro-batch of windows of end of text, never read; the run's
 * data settings stay as the checkpoint's, so its windows are those of eval.tasks in training. */
static int task_data(ust_config *c, const char *dir, const task_set *s, const tok_tokenizer *tok,
                     int eot, ust_err *e) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/train_000.bin", dir);
    int vocab = tok_vocab_size(tok) > eot ? tok_vocab_size(tok) : eot + 1;
    int64_t pad = (int64_t)(c->train.seq_len + 1) * (c->train.micro_batch_size + 1),
            n = s->ntok + pad;
    int32_t *tokens = malloc((size_t)n * sizeof *tokens);
    UST_ASSERT(tokens, "out of memory");
    memcpy(tokens, s->tokens, (size_t)s->ntok * sizeof *tokens);
    for (int64_t i = s->ntok; i < n; i++) tokens[i] = eot;
    int rc = data_write_llmc_shard(p, tokens, n, e) ||
             prep_write_meta(dir, NULL, eot, vocab, vocab <= 65536 ? 2 : 4, NULL, e);
    free(tokens);
    if (rc) return -1;
    c->data.val_steps = 1, c->data.val_samples = 0, c->data.val_tokens = 0, c->data.eot_id = eot;
    return cfg_validate(c, 0, e);
}

static void task_cleanup(const char *dir) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/train_000.bin", dir), unlink(p);
    snprintf(p, sizeof p, "%s/meta.json", dir), unlink(p);
    rmdir(dir);
}

static void task_report(const eval_args *a, const task_set *s, const double *ll, double dt) {
    FILE *f = a->scores ? fopen(a->scores, "w") : NULL;
    if (a->scores && !f) fprintf(stderr, "ustrain: warning: %s: cannot write\n", a->scores);
    task_scores sc = train_task_score(s, ll, f);
    if (f) fclose(f);
    printf("eval: task %s: %d items (%lld choices), acc %.4f acc_norm %.4f loglik %.6f, %.1f "
           "items/s\n",
           a->task, s->n, (long long)s->nex, sc.acc, sc.acc_norm, sc.loglik,
           dt > 0 ? s->n / dt : 0.0);
}

static int eval_task(eval_args *a, int argc, char **argv) {
    char dir[] = "/tmp/ustrain-task.XXXXXX", glob[64];
    if (!mkdtemp(dir)) return fprintf(stderr, "ustrain: error: mkdtemp: %s\n", strerror(errno)), 1;
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    a->data = glob;
    ust_config c;
    ust_err e;
    tok_tokenizer *tok = NULL;
    task_set s = {0};
    int rc = model_config(&c, a->model, &e) || apply_overrides(&c, argc, argv, a, &e) ||
             task_tokenizer(a, &c, &tok, &e);
    int eot = rc ? 0 : tok_eot(tok) >= 0 ? tok_eot(tok) : 0;
    if (!rc)
        rc = task_load(&s, a->task, tok, eot, c.train.seq_len, &e) ||
             task_data(&c, dir, &s, tok, eot, &e);
    tok_free(tok);
    c.checkpoint.dir[0] = 0;
    ust_runtime rt;
    if (!rc && train_runtime_init(&rt, &c, &e)) rc = 1;
    if (rc) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    double *ll = rc ? NULL : calloc((size_t)s.nex, sizeof *ll), t0 = log_now_s();
    if (!rc && (rc = train_eval_task(&c, &rt, &s, ll)) == 0 && rt.rank == 0)
        task_report(a, &s, ll, log_now_s() - t0);
    if (rc == 0) train_runtime_finalize(&rt);
    task_cleanup(dir);
    task_free(&s), free(ll);
    return rc ? UST_EXIT_USAGE : 0;
}

int cmd_eval(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(EVAL_USAGE);
    eval_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    if (a.task) return eval_task(&a, argc, argv);
    ust_config c;
    ust_err e;
    int steps = 0;
    if (model_config(&c, a.model, &e) || apply_overrides(&c, argc, argv, &a, &e) ||
        cfg_validate(&c, 0, &e) || eval_steps(&c, &a, &steps, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    c.data.val_steps = steps;
    c.data.val_samples = 0, c.data.val_tokens = 0; /* --steps or the whole of --data */
    c.checkpoint.dir[0] = 0; /* read-only: no lock on the run's checkpoint directory */
    ust_runtime rt;
    if (train_runtime_init(&rt, &c, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    if (rt.rank == 0) /* what is evaluated (a checkpoint directory gives its newest step that
                       * verifies); no training notes follow */
        printf("eval: %s %s\n", strcmp(c.checkpoint.resume, "none") ? "checkpoint" : "model",
               strcmp(c.checkpoint.resume, "none") ? c.checkpoint.resume : c.model.init_from);
    double loss = NAN;
    rc = train_eval(&c, &rt, &loss);
    if (rc == 0 && rt.rank == 0)
        printf("eval: loss %.6f ppl %.4f tokens %lld\n", loss, exp(loss),
               (long long)steps * c.train.micro_batch_size * c.train.seq_len);
    if (rc == 0) train_runtime_finalize(&rt);
    if (rc == 0 && !isfinite(loss)) { /* as training stops on one (every rank has the loss) */
        fprintf(stderr,
                "ustrain: error: eval: the loss is not finite (%g): the model's weights "
                "hold NaN or infinity, or overflow on this data\n",
                loss);
        rc = UST_EXIT_RUNTIME;
    }
    return rc;
}
