/* train.c: the step loop of one rank (docs/design.md section 4 fixes what a step consumes). */
#include "train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ckpt.h"
#include "data.h"
#include "dp.h"
#include "error.h"
#include "fs.h"
#include "hf_import.h"
#include "log.h"
#include "mem.h"
#include "model.h"
#include "ops.h"
#include "ops_prof.h"
#include "spike.h"
#include "optim.h"
#include "cp.h"
#include "ep.h"
#include "moe.h"
#include "plan.h"
#include "pp.h"
#include "tp.h"

/* Set by SIGTERM/SIGUSR1 and read between steps: the only state a signal handler may touch. */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

void train_install_stop_handlers(void) {
    signal(SIGTERM, on_stop_signal);
    signal(SIGUSR1, on_stop_signal);
}

typedef struct {
    const ust_config *cfg;
    ust_runtime *rt;
    int rank0;        /* this rank prints, logs and writes state.json */
    int fresh;        /* started from an import or the init, not a checkpoint */
    ust_ops *ops;     /* what everything computes with: the backend, or the op profiler on it */
    ust_ops *backend; /* the CPU or CUDA backend itself (its own calls need it) */
    ust_arena arena;
    ust_tp tp;
    ust_cp cp;
    ust_ep ep; /* with MoE layers */
    model *m;
    dp_state *dp;
    pp_state *pp;   /* pipeline executor (NULL without pipeline parallelism) */
    int has_moe;    /* the model has mixture-of-experts layers */
    int tied_param; /* pipeline with tied embeddings: this rank's table or copy (-1: none) */
    data_blend *train, *val;     /* a lone glob is a blend of one */
    data_blend_pos pos;          /* where the training blend stands (at the step's start) */
    int32_t *docs, *doc_scratch; /* data.doc_mask: B x Tl document starts, T of one window */
    int eot;                     /* the end-of-text id documents end with */
    int *which, *val_which;      /* the step's global batch (the validation samples): dataset */
    int64_t *index, *val_index;  /* ... and its sample */
    ust_log log;
    int32_t *samples;           /* host: B x (T+1), one micro-batch's windows */
    int32_t *positions;         /* host: the Tl positions this rank's tokens have */
    int Tl;                     /* tokens of each sequence on this rank (T / cp) */
    float *flag;                /* one device float for any_rank */
    int64_t step, sample_index; /* the run's position: steps done, samples consumed */
    int64_t batch_since_step, batch_since_sample; /* where the current global batch size began */
    int resumed_seq_len; /* the resumed checkpoint's train.seq_len (0: none, or not known) */
    double last_loss;
    double started_s; /* when this process began training (train.exit_after_min counts from it) */
    spike_window loss_w, norm_w; /* train.on_spike: the recent steps' losses and norms */
    int64_t fault_spike_step;    /* UST_FAULT_SPIKE_STEP (tests): the step poisoned, or 0 */
    int restarts;                /* UST_RESTART_COUNT (scripts/ustrun --max-restarts) */
    ckpt_lock lock;              /* rank 0: the job's lock on checkpoint.dir */
    ckpt_stage *stage;           /* checkpoint.async: the host buffer the slices are copied to */
    void *stage_buf;             /* its memory when the backend gave it (page-locked on CUDA) */
    ckpt_writer *pending;        /* checkpoint.async: the save still being written */
    int64_t pending_step, pending_started; /* its step, and the step it was started after */
    double ckpt_save_s, ckpt_wait_s; /* the step loop's time in saves, and waiting for async ones */
    int ckpt_saves;
} trainer;

/* ------------------------------------------------------------------ the runtime */

int train_runtime_init(ust_runtime *rt, const ust_config *cfg, ust_err *e) {
    memset(rt, 0, sizeof *rt);
    if (boot_init(&rt->boot, cfg->dist.timeout_s, e)) return -1;
    rt->rank = rt->boot.rank;
    rt->world = rt->boot.world;
    if (rt->world > 1) ust_error_set_rank(rt->rank);
    topo_grid g;
    /* GPUs talk through NCCL; a single GPU needs no communicator backend beyond the trivial */
    comm_backend be =
        cfg->run.device == DEV_CUDA && rt->world > 1 ? COMM_BACKEND_NCCL : COMM_BACKEND_SHM;
    comm_opts co = {.backend = be, .timeout_s = cfg->dist.timeout_s};
    if (topo_grid_from_config(&g, cfg, rt->world, e) ||
        comm_ctx_init(&rt->comm, &rt->boot, &co, e) ||
        topo_connect(&rt->topo, &g, rt->comm, rt->rank, e)) {
        if (rt->comm) comm_ctx_free(rt->comm);
        boot_finalize(&rt->boot);
        rt->comm = NULL;
        return -1;
    }
    if (rt->rank == 0 && rt->boot.nnodes > 1 && !cfg->parallel.tp_across_nodes)
        topo_warn_across_nodes(&g, &rt->boot, stderr);
    return 0;
}

void train_runtime_finalize(ust_runtime *rt) {
    if (!rt->comm) return;
    comm_req r = comm_barrier(rt->topo.comm[TOPO_WORLD]); /* nobody leaves while others work */
    comm_wait(&r);
    topo_disconnect(&rt->topo);
    comm_ctx_free(rt->comm);
    boot_finalize(&rt->boot);
    rt->comm = NULL;
}

static uint64_t bytes_sent(ust_comm *c) {
    const comm_counters *k = comm_get_counters(c);
    uint64_t total = 0;
    for (int i = 0; i < COMM_NKINDS; i++) total += k->bytes[i];
    return total;
}

/* The sum of v over group k (exact below 2^24: counts), through the one device float. */
static double group_sum(trainer *t, int k, double v) {
    const ust_comm *g = t->rt->topo.comm[k];
    if (!g || comm_size(g) == 1) return v;
    float f = (float)v;
    t->ops->to_device(t->ops, t->flag, &f, sizeof f);
    comm_req r = comm_allreduce((ust_comm *)g, t->flag, t->flag, 1, COMM_FP32, COMM_SUM);
    comm_wait(&r);
    t->ops->to_host(t->ops, &f, t->flag, sizeof f);
    return f;
}

/* 1 when flag is set on any rank of the job. */
static int any_rank(trainer *t, int flag) {
    if (t->rt->world == 1) return flag;
    return group_sum(t, TOPO_WORLD, flag) > 0;
}

/* The lowest rank whose `failed` is set and, into msg, its message (this rank's on the way in).
 * Only on the failure path: the buffer is the backend's, outside the arena the plan counts. */
#define REASON_BYTES 1024
static int first_failed_rank(trainer *t, int failed, char *msg, size_t cap) {
    int n = t->rt->world;
    size_t floats = REASON_BYTES / sizeof(float);
    char *host = calloc((size_t)n + 1, REASON_BYTES);
    float *dev = t->ops->alloc(t->ops, ((size_t)n + 1) * REASON_BYTES);
    UST_ASSERT(host, "out of memory for %d reasons", n);
    if (failed) snprintf(host, REASON_BYTES, "%s", msg ? msg : "");
    host[0] = failed ? (host[0] ? host[0] : ' ') : 0; /* an empty string means "not failed" */
    t->ops->to_device(t->ops, dev, host, REASON_BYTES);
    comm_req r = comm_allgather(t->rt->topo.comm[TOPO_WORLD], dev, dev + floats, floats, COMM_FP32);
    comm_wait(&r); /* raw bytes: a gather copies, it never computes on them */
    t->ops->to_host(t->ops, host + REASON_BYTES, dev + floats, (size_t)n * REASON_BYTES);
    int first = -1;
    for (int i = 0; i < n && first < 0; i++)
        if (host[(size_t)(i + 1) * REASON_BYTES]) first = i;
    if (first >= 0 && msg && cap) {
        char *m = host + (size_t)(first + 1) * REASON_BYTES;
        m[REASON_BYTES - 1] = 0;
        snprintf(msg, cap, "%s", m);
    }
    t->ops->free(t->ops, dev);
    free(host);
    return first;
}

/* The checkpoint writer's barrier (ckpt_sync_fn). */
static int world_sync(void *arg, int failed, char *msg, size_t cap) {
    trainer *t = arg;
    if (!any_rank(t, failed)) return -1;
    if (t->rt->world == 1 || !msg) return 0; /* without msg: whether any, not which */
    return first_failed_rank(t, failed, msg, cap);
}

/* ------------------------------------------------------------------ set-up */

static int open_blend(data_blend **b, const ust_config *c, int val, ust_err *e) {
    cfg_dataset sets[CFG_MAX_BLEND];
    int n = cfg_data_sets(c, val, sets);
    return data_blend_open(b, sets, n, c->data.format, c->model.vocab_size, c->train.seq_len, e);
}

/* The shards' meta.json against the model, and the end-of-text id documents end with. */
static int check_meta(trainer *t, ust_err *e) { return data_check_meta(t->cfg, &t->eot, e); }

/* The datasets, and the assignment of the validation samples (the same every time: val_steps
 * micro-batches from the blend's start). */
static int open_data(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    int64_t G = c->train.global_batch_size,
            V = (int64_t)c->data.val_steps * c->train.micro_batch_size;
    t->which = malloc((size_t)G * sizeof *t->which);
    t->index = malloc((size_t)G * sizeof *t->index);
    UST_ASSERT(t->which && t->index, "out of memory");
    if (open_blend(&t->train, c, 0, e) || check_meta(t, e)) return -1;
    if (c->data.val[0] && c->data.val_every > 0 && c->data.val_steps > 0) {
        if (open_blend(&t->val, c, 1, e)) return -1;
        t->val_which = malloc((size_t)V * sizeof *t->val_which);
        t->val_index = malloc((size_t)V * sizeof *t->val_index);
        UST_ASSERT(t->val_which && t->val_index, "out of memory");
        data_blend_pos start = {0};
        data_blend_assign(t->val, &start, 0, V, t->val_which, t->val_index);
    }
    return 0;
}

/* The step's global batch: which dataset and sample each of its G samples is (every rank
 * computes all of them and reads its share); a dataset entering a new epoch is logged. */
static void assign_step(trainer *t) {
    const ust_config *c = t->cfg;
    int64_t G = c->train.global_batch_size;
    data_blend_assign(t->train, &t->pos, t->sample_index, G, t->which, t->index);
    for (int64_t k = 0; k < G && t->rank0; k++) {
        int64_t S = data_blend_epoch_samples(t->train, t->which[k], c->train.seq_len);
        if (t->index[k] > 0 && t->index[k] % S == 0)
            printf("data: dataset %d (%s) starts epoch %lld at step %lld\n", t->which[k],
                   data_blend_set(t->train, t->which[k])->path, (long long)(t->index[k] / S + 1),
                   (long long)t->step + 1);
    }
}

/* ------------------------------------------------------------------ checkpoints */

/* The tokenizer the training data was made with, for export to ship beside the model: from the
 * meta.json data prep writes beside the shards (in the directory of data.train's glob, as
 * data_meta_read finds it; of a blend, its first dataset's), as {"path", "sha256", "eot_id"};
 * NULL when there is none, or it names no tokenizer. */
static cJSON *data_tokenizer(const ust_config *c) {
    cfg_dataset sets[CFG_MAX_BLEND];
    if (cfg_data_sets(c, 0, sets) < 1) return NULL;
    const char *slash = strrchr(sets[0].path, '/');
    char path[UST_PATH_MAX + 32];
    snprintf(path, sizeof path, "%.*s/meta.json", slash ? (int)(slash - sets[0].path) : 1,
             slash ? sets[0].path : ".");
    FILE *f = fopen(path, "rb");
    char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    cJSON *meta = cJSON_Parse(buf), *out = NULL;
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(meta, "tokenizer"),
                *sha = cJSON_GetObjectItemCaseSensitive(meta, "tokenizer_sha256"),
                *eot = cJSON_GetObjectItemCaseSensitive(meta, "eot_id");
    if (cJSON_IsString(tok)) {
        out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "path", tok->valuestring);
        if (cJSON_IsString(sha)) cJSON_AddStringToObject(out, "sha256", sha->valuestring);
        if (cJSON_IsNumber(eot))
            cJSON_AddNumberToObject(out, "eot_id", eot->valuedouble);
        else
            cJSON_AddNullToObject(out, "eot_id");
    }
    cJSON_Delete(meta);
    return out;
}

static char *state_json(trainer *t) {
    const ust_config *c = t->cfg;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", "ustrain-checkpoint-1");
    cJSON_AddNumberToObject(j, "step", (double)t->step);
    cJSON_AddNumberToObject(j, "sample_index", (double)t->sample_index);
    cJSON_AddNumberToObject(j, "seed", (double)c->run.seed);
    cJSON_AddNumberToObject(j, "loss", isfinite(t->last_loss) ? t->last_loss : 0);
    cJSON *since = cJSON_AddObjectToObject(j, "batch_since");
    cJSON_AddNumberToObject(since, "step", (double)t->batch_since_step);
    cJSON_AddNumberToObject(since, "sample_index", (double)t->batch_since_sample);
    cJSON_AddNumberToObject(since, "global_batch_size", c->train.global_batch_size);
    data_blend_save(t->train, &t->pos, j);
    cJSON *lay = cJSON_AddObjectToObject(j, "layout");
    cJSON_AddNumberToObject(lay, "dp", c->parallel.dp);
    cJSON_AddNumberToObject(lay, "tp", c->parallel.tp);
    cJSON_AddNumberToObject(lay, "pp", c->parallel.pp);
    cJSON_AddNumberToObject(lay, "cp", c->parallel.cp);
    cJSON_AddNumberToObject(lay, "ep", c->parallel.ep);
    cJSON_AddNumberToObject(lay, "vpp", c->parallel.vpp);
    cJSON_AddNumberToObject(lay, "zero_stage", c->optimizer.zero_stage);
    char *yaml = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&yaml, &len);
    cfg_dump(c, f);
    fclose(f);
    cJSON_AddStringToObject(j, "config", yaml);
    free(yaml);
    cJSON *tok = data_tokenizer(c);
    if (tok) cJSON_AddItemToObject(j, "tokenizer", tok);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

/* checkpoint.async: completes the save in flight (block: waits for every rank's writer; else only
 * when all are done, which every rank learns at the same step boundary). */
static int finish_pending(trainer *t, int block, ust_err *e) {
    if (!t->pending) return 0;
    double t0 = log_now_s();
    int rc = ckpt_poll(t->pending, block, e);
    t->ckpt_wait_s += log_now_s() - t0;
    if (rc == 1) return 0;
    t->pending = NULL;
    if (rc == 0 && t->rank0)
        printf("checkpoint step_%lld committed (written in the background during %lld step%s)\n",
               (long long)t->pending_step, (long long)(t->step - t->pending_started),
               t->step - t->pending_started == 1 ? "" : "s");
    return rc;
}

/* Writes step t->step: synchronously, or (checkpoint.async) staged and handed to the writer
 * thread, after the previous async save has completed. */
static int save_checkpoint(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    if (finish_pending(t, 1, e)) return -1;
    double t0 = log_now_s();
    ckpt_writer *w =
        ckpt_begin(c->checkpoint.dir, t->step, t->rt->rank, t->rt->boot.job_id, world_sync, t, e);
    if (!w) return -1;
    if (t->stage) ckpt_set_stage(w, t->stage);
    dp_save(t->dp, w, e); /* a failure is sticky in w: the commit reports it on every rank */
    char *state = t->rank0 ? state_json(t) : NULL;
    int rc = t->stage ? ckpt_commit_async(w, state, c->checkpoint.keep_last, e)
                      : ckpt_commit(w, state, c->checkpoint.keep_last, e);
    if (t->stage && rc == 0) t->pending = w, t->pending_step = t->pending_started = t->step;
    free(state);
    t->ckpt_save_s += log_now_s() - t0;
    t->ckpt_saves++;
    return rc;
}

/* The checkpoint to continue from, verified by every rank against its manifest (each its share
 * of the blocks): the one `named` (checkpoint.resume), which must verify, or the newest in
 * checkpoint.dir, falling back to older complete ones with a warning while one does not. 1 and
 * its directory in dir, 0 when there is none, -1 with the reason. */
static int verified_checkpoint(trainer *t, const char *named, char *dir, size_t n, ust_err *e) {
    const char *root = t->cfg->checkpoint.dir;
    int found = named ? 1 : ckpt_find_latest(root, dir, (int)n, e);
    if (named) snprintf(dir, n, "%s", named);
    while (found == 1) {
        if (ckpt_verify(dir, t->rt->rank, t->rt->world, world_sync, t, e) == 0) return 1;
        if (named) return -1; /* asked for by name: nothing else is tried */
        if (t->rank0)
            fprintf(stderr,
                    "ustrain: warning: %s; falling back to the previous complete checkpoint\n",
                    e->msg);
        char bad[sizeof e->msg];
        snprintf(bad, sizeof bad, "%s", dir);
        found = ckpt_find_latest_before(root, ckpt_dir_step(dir), dir, (int)n, e);
        if (found == 0)
            return ust_errf(e,
                            "checkpoint %s failed verification and no earlier complete checkpoint "
                            "is in %s (set checkpoint.resume: none to start over)",
                            bad, root);
    }
    return found;
}

/* The position must be one this run can continue from: within train.steps, and the data
 * position the steps imply (a checkpoint from before batch_since was recorded has had the
 * run's global batch size all along). A new global batch size starts a new batch_since. */
static int read_state(trainer *t, const char *json, const char *dir, ust_err *e) {
    const ust_config *c = t->cfg;
    ckpt_state st;
    if (ckpt_parse_state(json, dir, &st, e)) return -1;
    if (st.step > c->train.steps)
        return ust_errf(e,
                        "checkpoint %s is at step %lld, beyond train.steps = %lld (raise "
                        "train.steps to go on, or set checkpoint.resume: none to start over)",
                        dir, (long long)st.step, (long long)c->train.steps);
    int64_t G = c->train.global_batch_size;
    if (!st.batch_size && st.sample_index != st.step * G)
        return ust_errf(e,
                        "checkpoint %s: sample_index %lld is not step %lld x global_batch_size "
                        "%lld",
                        dir, (long long)st.sample_index, (long long)st.step, (long long)G);
    cJSON *state = cJSON_Parse(json); /* ckpt_parse_state has checked it parses */
    char note[1536];
    ust_err why;
    int rc = data_blend_restore(t->train, state, st.sample_index, c->data.allow_reweight, &t->pos,
                                note, sizeof note, &why);
    cJSON_Delete(state);
    if (rc) return ust_errf(e, "checkpoint %s: %s", dir, why.msg);
    if (note[0] && t->rank0) printf("%s\n", note);
    t->step = st.step;
    t->sample_index = st.sample_index;
    t->last_loss = st.loss;
    ust_config was; /* what the position was counted in (0: not known) */
    t->resumed_seq_len = ckpt_load_config(dir, "resume", &was, &why) == 0 ? was.train.seq_len : 0;
    bool same_batch = !st.batch_size || st.batch_size == G;
    t->batch_since_step = same_batch ? st.batch_since_step : st.step;
    t->batch_since_sample = same_batch ? st.batch_since_sample : st.sample_index;
    return 0;
}

static int load_checkpoint(trainer *t, const char *dir, ust_err *e) {
    ckpt_reader *r = ckpt_open(dir, e);
    if (!r) return -1;
    int rc = read_state(t, ckpt_state_json(r), dir, e);
    if (rc == 0) rc = dp_load(t->dp, r, e);
    ckpt_close(r);
    return rc;
}

static int read_hf(void *h, const ckpt_tensor *t, const ckpt_slice *s, float *host, ust_err *e) {
    return hf_read_slice(h, t, s, host, e);
}

/* Every rank reads only its own slices; the figures show it (about 1/tp or 1/pp of the bytes). */
static int load_hf(trainer *t, const char *dir, ust_err *e) {
    hf_model *h = hf_open(dir, e);
    if (!h) return -1;
    int rc = dp_load_slices(t->dp, read_hf, h, e);
    if (rc == 0) {
        int64_t got = hf_bytes_read(h), all = hf_tensor_bytes(h);
        printf("rank %d: imported %s: read %lld of the files' %lld tensor bytes (%.1f%%)\n",
               t->rt->rank, dir, (long long)got, (long long)all, all ? 100.0 * got / all : 0.0);
        fflush(stdout);
    }
    hf_close(h);
    return rc;
}

/* Finds what to start from: a checkpoint (resume), a Hugging Face directory or an llm.c file,
 * or a fresh init. */
static int initialize(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    char dir[UST_PATH_MAX + 64] = "";
    int found = 0;
    if (strcmp(c->checkpoint.resume, "none") != 0) {
        int named = strcmp(c->checkpoint.resume, "auto") != 0;
        found = verified_checkpoint(t, named ? c->checkpoint.resume : NULL, dir, sizeof dir, e);
        if (found < 0) return -1;
    }
    if (found) {
        if (load_checkpoint(t, dir, e)) return -1;
        if (t->rank0)
            printf("resuming from %s (step %lld, sample %lld)\n", dir, (long long)t->step,
                   (long long)t->sample_index);
        return 0;
    }
    t->fresh = 1;
    if (hf_is_model_dir(c->model.init_from)) return load_hf(t, c->model.init_from, e);
    if (c->model.init_from[0]) return dp_load_llmc(t->dp, c->model.init_from, e);
    dp_init_params(t->dp, c->run.seed);
    return 0;
}

/* ------------------------------------------------------------------ one step */

/* data.doc_mask: where the document of each of this rank's tokens begins. A document ends with
 * its end-of-text token (which predicts the next document's first), so input t starts a new one
 * when input t-1 is end of text; the positions are the sequence's, whatever rank holds them. */
static void find_docs(trainer *t) {
    int B = t->cfg->train.micro_batch_size, T = t->cfg->train.seq_len, Tl = t->Tl;
    for (int b = 0; b < B; b++) {
        const int32_t *w = t->samples + (int64_t)b * (T + 1);
        for (int p = 0, start = 0; p < T; p++) {
            t->doc_scratch[p] = start;
            if (w[p] == t->eot) start = p + 1;
        }
        for (int j = 0; j < Tl; j++) t->docs[b * Tl + j] = t->doc_scratch[t->positions[j]];
    }
    model_set_docs(t->m, t->docs);
}

/* Takes this rank's tokens of B windows of T+1 tokens (all of them, or its context-parallel
 * chunks) as inputs, and the token after each as its target. */
static void split_windows(trainer *t, int32_t *inputs, int32_t *targets) {
    int B = t->cfg->train.micro_batch_size, T = t->cfg->train.seq_len, Tl = t->Tl;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tl; j++) {
            const int32_t *w = t->samples + (int64_t)b * (T + 1) + t->positions[j];
            inputs[b * Tl + j] = w[0];
            targets[b * Tl + j] = w[1];
        }
    if (t->docs) find_docs(t);
}

/* The first sample of micro-batch mb of this step on this rank: its data-parallel block of the
 * global batch starts at sample_index + dp_rank * G/dp. */
static int64_t first_sample(trainer *t, int mb) {
    const ust_config *c = t->cfg;
    int64_t G = c->train.global_batch_size, dp_rank = t->rt->topo.me.dp;
    return t->sample_index + dp_rank * (G / c->parallel.dp) +
           (int64_t)mb * c->train.micro_batch_size;
}

/* This rank's tokens of micro-batch mb of the step (of the validation set): the loop below and
 * the pipeline executor both load through these. */
static void load_train(void *ctx, int mb, int32_t *inputs, int32_t *targets) {
    trainer *t = ctx;
    const ust_config *c = t->cfg;
    int64_t g = first_sample(t, mb) - t->sample_index; /* in the step's global batch */
    int poison = t->fault_spike_step > 0 && g == 0 &&
                 t->sample_index == (t->fault_spike_step - 1) * c->train.global_batch_size;
    for (int b = 0; b < c->train.micro_batch_size; b++)
        data_blend_get(t->train, t->which[g + b], t->index[g + b], c->train.seq_len,
                       c->data.shuffle, c->run.seed,
                       t->samples + (int64_t)b * (c->train.seq_len + 1));
    split_windows(t, inputs, targets);
    /* test fault UST_FAULT_SPIKE_STEP=N: the first micro-batch of step N's data (samples from
     * (N-1) x global_batch_size: a rewind moves past them) learns garbage targets */
    for (int k = 0; poison && k < c->train.micro_batch_size * t->Tl; k++)
        targets[k] = (int32_t)((targets[k] * 7919LL + 13) % c->model.vocab_size);
}

static void load_val(void *ctx, int mb, int32_t *inputs, int32_t *targets) {
    trainer *t = ctx;
    const ust_config *c = t->cfg;
    int B = c->train.micro_batch_size;
    for (int b = 0; b < B; b++) {
        int64_t k = (int64_t)mb * B + b;
        data_blend_get(t->val, t->val_which[k], t->val_index[k], c->train.seq_len, 0, c->run.seed,
                       t->samples + (int64_t)b * (c->train.seq_len + 1));
    }
    split_windows(t, inputs, targets);
}

static void pp_before_grads(void *ctx, int mb, int last) {
    (void)mb;
    dp_begin_microbatch(((trainer *)ctx)->dp, last);
}

/* Tied embeddings over a pipeline: the first stage's table and the last stage's copy get the
 * sum of both gradients (each already reduced over its data-parallel group, piece by piece:
 * the two units are laid out alike, so the pieces match). */
static void sync_tied_grads(trainer *t) {
    if (t->tied_param < 0) return;
    /* ZeRO-3's vocabulary chunks: one parameter per chunk, in the same order on both ends */
    for (int i = t->tied_param; i < model_num_params(t->m); i++) {
        if (strcmp(model_param_at(t->m, i)->name, "model.embed_tokens.weight") != 0) continue;
        int64_t n;
        float *g = dp_grad_piece(t->dp, i, &n);
        pp_sync_tied(t->pp, g, n);
    }
}

/* Forward and backward over this rank's micro-batches of the step, through the pipeline
 * executor (the only path; one stage is gradient accumulation); returns the global-batch mean
 * loss. This rank's block of the global batch starts at sample_index + dp_rank * G/dp. */
static double forward_backward(trainer *t) {
    const ust_config *c = t->cfg;
    int64_t G = c->train.global_batch_size, T = c->train.seq_len;
    pp_callbacks cb = {t, load_train, pp_before_grads};
    dp_begin_step(t->dp);
    double loss_sum = pp_train_step(t->pp, &cb, 1.0f / (float)(G * T));
    dp_finish_grads(t->dp);
    sync_tied_grads(t);
    double moe = model_take_moe_loss(t->m);
    if (t->has_moe) moe = dp_sum(t->dp, pp_sum(t->pp, moe));
    return dp_sum(t->dp, pp_sum(t->pp, loss_sum)) / (double)(G * T) + moe;
}

/* Only the last stage counts; the pipeline sum brings it to every stage. Every dp rank
 * evaluates the same windows, each cp rank its own tokens of them: summing both over the group
 * counts every token the same number of times. */
static double validation_loss(trainer *t) {
    pp_callbacks cb = {t, load_val, pp_before_grads};
    int64_t count = 0;
    double sum = pp_sum(t->pp, pp_forward_only(t->pp, &cb, t->cfg->data.val_steps, &count));
    count = (int64_t)pp_sum(t->pp, (double)count);
    return dp_sum(t->dp, sum) / dp_sum(t->dp, (double)count);
}

/* ------------------------------------------------------------------ the loop */

/* Where the run writes (run.out_dir, the metrics file, TensorBoard's directory) must be its own:
 * never a file, never inside a checkpoint's step (ckpt_refuse_in_step). Checked on every rank
 * before anything is read or written. */
static int check_outputs(const ust_config *cfg, ust_err *e) {
    struct stat st;
    if (stat(cfg->run.out_dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return ust_errf(e, "run.out_dir %s is %s, not a directory", cfg->run.out_dir,
                        fs_kind(st.st_mode));
    if (ckpt_refuse_in_step(cfg->run.out_dir, "run.out_dir", e)) return -1;
    if (cfg->logging.metrics_file[0] &&
        ckpt_refuse_output(cfg->logging.metrics_file, "logging.metrics_file", e))
        return -1;
    if (cfg->logging.tensorboard_dir[0] &&
        ckpt_refuse_in_step(cfg->logging.tensorboard_dir, "logging.tensorboard_dir", e))
        return -1;
    return 0;
}

/* What no single config key can check: the backend's precision and the sequence-parallel rows. */
static int check_runnable(const ust_config *cfg, ust_err *e) {
    if (check_outputs(cfg, e)) return -1;
    if (cfg->run.device == DEV_CPU && cfg->train.precision == PREC_BF16)
        return ust_errf(e, "train.precision = bf16: the CPU backend computes in fp32 only; use "
                           "fp32, or run.device: cuda");
    int cp = cfg->parallel.cp;
    if (cfg->parallel.sp &&
        cfg->train.micro_batch_size * (cfg->train.seq_len / cp) % cfg->parallel.tp != 0)
        return ust_errf(e,
                        "parallel.sp: the %d x %d tokens a rank holds of a micro-batch do not "
                        "split over parallel.tp = %d ranks",
                        cfg->train.micro_batch_size, cfg->train.seq_len / cp, cfg->parallel.tp);
    return 0;
}

/* Test fault: UST_FAULT_SETUP_SLEEP_MS holds start-up, for a signal to arrive during it. */
static void fault_setup_hold(void) {
    const char *hold = getenv("UST_FAULT_SETUP_SLEEP_MS");
    if (!hold) return;
    struct timespec ts = {atoi(hold) / 1000, (long)(atoi(hold) % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The compute backend (or the op profiler on it) and the arena everything is carved from. */
static int open_backend(trainer *t, int profile, ust_err *e) {
    const ust_config *cfg = t->cfg;
    ust_runtime *rt = t->rt;
    if (!(t->backend = ops_create(cfg, rt->boot.local_rank, rt->boot.local_world, e))) return -1;
    comm_ctx_set_stream(rt->comm, t->backend->stream(t->backend)); /* NULL on the CPU */
    t->ops = profile ? ops_prof_create(t->backend) : t->backend;
    UST_ASSERT(t->ops->act_size == cfg_act_size(cfg), "backend activations of %d bytes, plan %d",
               t->ops->act_size, cfg_act_size(cfg)); /* the memory plan counts on it */
    mem_init(&t->arena, t->ops);
    return 0;
}

/* Where the model's tensors live on this rank: tensor parallelism, the ZeRO unit padding, the
 * context- and expert-parallel groups and this rank's pipeline stages with their activation
 * sets (asked of the pipeline's schedule, which the executor then runs). */
static int plan_storage(trainer *t, model_storage *st, pps_schedule *sched, ust_err *e) {
    const ust_config *cfg = t->cfg;
    const ust_topology *topo = &t->rt->topo;
    int cp = cfg->parallel.cp;
    t->Tl = cfg->train.seq_len / cp;
    t->positions = malloc(t->Tl * sizeof(int32_t));
    cp_layout_positions(cfg->parallel.cp_layout, cfg->train.seq_len, cp,
                        comm_rank(topo->comm[TOPO_CP]), t->positions);
    if (cfg->data.doc_mask || cfg->data.reset_positions) {
        t->docs = malloc((size_t)cfg->train.micro_batch_size * t->Tl * sizeof(int32_t));
        t->doc_scratch = malloc((size_t)cfg->train.seq_len * sizeof(int32_t));
        UST_ASSERT(t->docs && t->doc_scratch, "out of memory");
    }
    /* the contexts of the dimensions that split a layer, each over the group it owns */
    tp_init(&t->tp, t->ops, topo->comm[TOPO_TP], &t->arena, cfg->train.micro_batch_size * t->Tl,
            cfg->model.d_model, cfg->parallel.sp);
    int start, H = tp_part(&t->tp, cfg->model.n_head, &start); /* attention after the tp split */
    int Hkv = tp_part(&t->tp, cfg->model.n_kv_head, &start);
    cp_init(&t->cp, t->ops, topo->comm[TOPO_CP], topo->comm[TOPO_CPA], topo->comm[TOPO_CPR],
            &t->arena, cfg->train.seq_len, cfg->train.micro_batch_size, H, Hkv, cfg_head_dim(cfg),
            cfg->parallel.cp_layout, cfg->parallel.cp_comm, cfg_cp_a2a(cfg));
    /* dense gradients are summed over the ranks that hold the same shard and saw different
     * tokens: the data-parallel replicas and the context-parallel parts of each sequence */
    *st = dp_model_storage(cfg, comm_size(topo->comm[TOPO_DPCP]));
    st->tp = &t->tp;
    st->cp = &t->cp;
    if (t->has_moe) { /* the MoE layers' dispatch context, sized for their tokens */
        int64_t send, recv;
        moe_dispatch_rows(cfg, (int64_t)cfg->train.micro_batch_size * t->Tl, cfg->parallel.ep,
                          &send, &recv);
        ep_init(&t->ep, t->ops, cfg->parallel.ep > 1 ? topo->comm[TOPO_EP] : NULL, &t->arena,
                cfg->model.moe.num_experts, cfg->model.d_model, send, recv);
        st->ep = &t->ep;
    }
    /* one stage's schedule is plain gradient accumulation (no transfers) */
    int slots[MODEL_MAX_CHUNKS] = {0};
    if (pp_plan(cfg, topo->me.pp, sched, slots, e)) return -1;
    pp_stages(cfg, topo->me.pp, slots, st); /* the pipeline decides the stages this rank holds */
    if (cfg->parallel.pp == 1) return 0;
    st->zb = pps_splits(sched); /* zb, dualpipev: W's keep their deferred weight gradients */
    if (cfg->optimizer.zero_stage == 3 && t->rank0)
        fprintf(stderr,
                "ustrain: warning: optimizer.zero_stage = 3 with parallel.pp = %d gathers every "
                "layer's weights again for each micro-batch's forward and backward; ZeRO-1 or 2 "
                "is the usual choice with pipelines\n",
                cfg->parallel.pp);
    return 0;
}

/* The model, its data-parallel optimizer state and the pipeline executor over them. */
static int build_model(trainer *t, ust_err *e) {
    const ust_config *cfg = t->cfg;
    const ust_topology *topo = &t->rt->topo;
    model_storage st;
    pps_schedule sched = {0};
    if (plan_storage(t, &st, &sched, e)) return -1;
    dp_groups groups = {.dense = topo->comm[TOPO_DPCP],
                        .expert = topo->comm[TOPO_EDPCP],
                        .ep = topo->comm[TOPO_EP],
                        .mp = topo->comm[TOPO_TP],
                        .pipe = cfg->parallel.pp > 1 ? topo->comm[TOPO_PP] : NULL,
                        .mirror = topo->comm[TOPO_MIRROR]};
    if (model_create_with(&t->m, cfg, t->ops, &t->arena, &st, e) ||
        dp_create(&t->dp, cfg, t->ops, &t->arena, t->m, &groups, e)) {
        pps_free(&sched);
        return -1;
    }
    /* tied embeddings over a pipeline: the first stage's table and the last stage's copy (none
     * where one rank holds both ends, dualpipev's rank 0: one tensor serves both) */
    t->tied_param = cfg->parallel.pp > 1 && cfg_tied(cfg) && !model_tied_local(t->m)
                        ? model_find_param(t->m, "model.embed_tokens.weight")
                        : -1;
    t->pp =
        pp_create(cfg, t->ops, &t->arena, t->m, topo->comm[TOPO_PP], topo->comm[TOPO_EMB], &sched);
    return 0;
}

/* checkpoint.async: the staging buffer, sized for what this rank writes, from the backend's host
 * memory (page-locked on CUDA) or, when it has none to give, ordinary memory. */
static int open_stage(trainer *t, ust_err *e) {
    int64_t bytes = dp_save_bytes(t->dp);
    t->stage_buf = t->backend->host_alloc(t->backend, (size_t)bytes);
    t->stage = t->stage_buf ? ckpt_stage_wrap(t->stage_buf, bytes, e) : ckpt_stage_create(bytes, e);
    return t->stage ? 0 : -1;
}

static int setup(trainer *t, const ust_config *cfg, ust_runtime *rt, int profile, ust_err *e) {
    memset(t, 0, sizeof *t);
    t->lock.fd = -1;
    t->cfg = cfg;
    t->rt = rt;
    t->rank0 = rt->rank == 0;
    t->last_loss = NAN;
    t->started_s = log_now_s();
    const char *fault = getenv("UST_FAULT_SPIKE_STEP"), *restart = getenv("UST_RESTART_COUNT");
    t->fault_spike_step = fault ? atoll(fault) : 0;
    t->restarts = restart ? atoi(restart) : 0;
    if (t->restarts > 0 && t->rank0)
        printf("restart %d of this job (scripts/ustrun --max-restarts)\n", t->restarts);
    if (cfg->train.on_spike != SPIKE_NONE) {
        spike_init(&t->loss_w, cfg->train.spike_window);
        spike_init(&t->norm_w, cfg->train.spike_window);
    }
    t->has_moe = cfg->model.moe.num_experts > 0;
    if (check_runnable(cfg, e)) return -1;
    fault_setup_hold();
    /* first, before anything is read: one job at a time may own the checkpoints */
    if (t->rank0 && cfg->checkpoint.dir[0] && ckpt_lock_dir(cfg->checkpoint.dir, &t->lock, e))
        return -1;
    if (open_data(t, e) || open_backend(t, profile, e) || build_model(t, e)) return -1;
    t->flag = mem_alloc(&t->arena, MEM_COMM, sizeof(float));
    mem_freeze(&t->arena);
    if (cfg->checkpoint.async && open_stage(t, e)) return -1;
    t->samples =
        malloc((size_t)cfg->train.micro_batch_size * (cfg->train.seq_len + 1) * sizeof(int32_t));
    return initialize(t, e);
}

static void teardown(trainer *t) {
    log_close(&t->log);
    ckpt_abort(t->pending); /* a run ending on an error: its save in flight is not published */
    ckpt_stage_free(t->stage);
    if (t->stage_buf) t->backend->host_free(t->backend, t->stage_buf);
    ckpt_unlock_dir(&t->lock);
    data_blend_close(t->train);
    data_blend_close(t->val);
    free(t->which), free(t->index), free(t->val_which), free(t->val_index);
    free(t->docs), free(t->doc_scratch);
    spike_free(&t->loss_w), spike_free(&t->norm_w);
    pp_destroy(t->pp);
    dp_destroy(t->dp);
    model_destroy(t->m);
    cp_free(&t->cp);
    if (t->has_moe) ep_free(&t->ep);
    if (t->backend) {
        mem_release(&t->arena);
        /* the communicators outlive the compute stream (the final barrier): stop ordering
         * their operations after a stream that is about to be destroyed */
        comm_ctx_set_stream(t->rt->comm, NULL);
        if (t->ops != t->backend) t->ops->destroy(t->ops);
        t->backend->destroy(t->backend);
    }
    free(t->samples);
    free(t->positions);
}

static void write_effective_config(const ust_config *cfg) {
    ust_err e;
    char path[UST_PATH_MAX + 32];
    if (fs_mkdir_p(cfg->run.out_dir, &e)) {
        fprintf(stderr, "ustrain: warning: %s\n", e.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/config.yaml", cfg->run.out_dir);
    FILE *f = fs_fopen_regular(path, "wb", &e);
    if (!f) {
        fprintf(stderr, "ustrain: warning: effective config %s\n", e.msg);
        return;
    }
    cfg_dump(cfg, f);
    fclose(f);
}

/* Dense bf16 peak of the GPUs ustrain is tuned for (H100/H200 SXM); set logging.peak_flops for
 * others. On CPU the backend's own measured sgemm rate is the honest denominator. */
#define GPU_PEAK_FLOPS 989e12

static double peak_flops(trainer *t) {
    if (t->cfg->logging.peak_flops > 0) return t->cfg->logging.peak_flops;
    if (t->cfg->run.device == DEV_CUDA) return GPU_PEAK_FLOPS;
    double measured = ops_measure_sgemm_flops(t->ops, 1024, 8); /* ~80 ms; smaller under-report */
    /* Test fault: UST_FAULT_PEAK_SCALE=F scales the measurement, as a busy machine would. */
    const char *scale = getenv("UST_FAULT_PEAK_SCALE");
    return scale ? measured * atof(scale) : measured;
}

/* A CPU peak measured while the machine was busy can be below what a step then achieves. The
 * rate a step reached is a rate this rank can reach, so it becomes the denominator from then
 * on: MFU never exceeds 100%. A configured peak (logging.peak_flops) and the GPU table stay. */
static double raise_measured_peak(trainer *t, double peak, double fpt, const log_step *s) {
    double achieved = fpt * s->tokens_per_s / t->rt->world; /* one rank's share */
    if (t->cfg->logging.peak_flops > 0 || t->cfg->run.device == DEV_CUDA || achieved <= peak)
        return peak;
    if (t->rank0)
        printf("mfu: step %lld ran at %.3g FLOP/s per rank, above the sgemm peak measured at "
               "start-up (%.3g, on a busy machine): that rate is the peak from now on\n",
               (long long)s->step, achieved, peak);
    return achieved;
}

/* Where every group's counters stood when a step began, so its report shows what the step
 * alone did. */
typedef struct {
    double t0;
    double wait_s[TOPO_NKINDS];
    uint64_t bytes[TOPO_NKINDS];
} step_mark;

static step_mark mark_step(trainer *t) {
    step_mark m = {.t0 = log_now_s()};
    for (int k = 0; k < TOPO_NKINDS; k++) {
        const ust_comm *c = t->rt->topo.comm[k];
        m.wait_s[k] = c ? comm_get_counters(c)->wait_s : 0;
        m.bytes[k] = c ? bytes_sent(t->rt->topo.comm[k]) : 0;
    }
    return m;
}

/* The figures of the step just done (s already holds step, loss, lr, norm and time). */
static void measure_step(trainer *t, const step_mark *m, double fpt, double peak, log_step *s) {
    double tokens = (double)t->cfg->train.global_batch_size * t->cfg->train.seq_len;
    s->tokens_per_s = tokens / (s->ms / 1e3);
    s->mfu = fpt * s->tokens_per_s / (peak * t->rt->world); /* peak is one rank's */
    s->peak_mem_bytes = t->arena.peak;
    step_mark now = mark_step(t);
    s->comm_bytes_tp = now.bytes[TOPO_TP] - m->bytes[TOPO_TP];
    s->tp_comm_ms = 1e3 * (now.wait_s[TOPO_TP] - m->wait_s[TOPO_TP]);
    /* the context-parallel group and, under a2a+ring, its Ulysses and ring sub-groups */
    static const topo_kind cp_groups[] = {TOPO_CP, TOPO_CPA, TOPO_CPR};
    s->cp_wait_ms = 0;
    s->comm_bytes_cp = 0;
    for (int i = 0; i < 3; i++) {
        s->cp_wait_ms += 1e3 * (now.wait_s[cp_groups[i]] - m->wait_s[cp_groups[i]]);
        s->comm_bytes_cp += now.bytes[cp_groups[i]] - m->bytes[cp_groups[i]];
    }
    s->ep_comm_ms = 1e3 * (now.wait_s[TOPO_EP] - m->wait_s[TOPO_EP]);
    s->comm_bytes_mirror = now.bytes[TOPO_MIRROR] - m->bytes[TOPO_MIRROR];
    s->mem_params = t->arena.bytes[MEM_PARAMS];
    s->mem_grads = t->arena.bytes[MEM_GRADS];
    s->mem_optim = t->arena.bytes[MEM_OPTIM];
    s->mem_acts = t->arena.bytes[MEM_ACTS];
}

/* Device allocations the CUDA backend has made so far (0 on the CPU). The step loop should make
 * none after its first step, which sizes the backend's scratch. */
static int64_t device_allocations(const trainer *t) {
    if (t->cfg->run.device != DEV_CUDA) return 0;
    ops_mem m;
    t->backend->memory(t->backend, &m);
    return m.allocations;
}

/* The report of the step just done (before t->step moves on). */
static log_step report_step(trainer *t, const step_mark *mark, double loss, double norm, double lr,
                            int finite, double fpt, double peak) {
    const ust_config *c = t->cfg;
    log_step s = {.step = t->step + 1,
                  .steps = c->train.steps,
                  .loss = loss,
                  .lr = lr,
                  .grad_norm = norm,
                  .ms = 1e3 * (log_now_s() - mark->t0),
                  .val_loss = NAN,
                  .pp_bubble = NAN,
                  .skipped = !finite,
                  .comm_bytes_dp = dp_bytes_sent(t->dp)}; /* before validation's gathers */
    measure_step(t, mark, fpt, peak, &s);
    s.cp_docs = c->parallel.cp > 1 && c->data.doc_mask;
    if (s.cp_docs) /* the context-parallel group's, since the run began */
        s.cp_blocks_skipped = (int64_t)group_sum(t, TOPO_CP, (double)t->cp.skipped);
    s.moe_n = model_moe_stats(t->m, s.moe_layer, s.moe_load_max, s.moe_load_mean, s.moe_dropped,
                              LOG_MAX_MOE);
    for (int i = 0; i < s.moe_n; i++)
        s.moe_ep = model_moe_rank_rows(t->m, i, s.moe_rank_rows[i], LOG_MAX_EP);
    if (c->parallel.pp > 1) {
        pp_stats ps = pp_last_step_stats(t->pp);
        s.pp_bubble = ps.bubble;
        s.pp_bubble_analytic = ps.analytic;
        s.comm_bytes_pp = ps.sent_bytes;
        s.pp_bubble_sim = ps.simulated;
        s.pp_op_ms[0] = ps.f_ms, s.pp_op_ms[1] = ps.b_ms, s.pp_op_ms[2] = ps.w_ms;
    }
    return s;
}

/* After a step: a periodic checkpoint, or the one a stop asks for (every rank stops after the
 * same step: a signal to any of them counts). 1: stop now; -1: the checkpoint failed. */
/* Why this rank wants to stop after the step, most urgent first: 3 a signal, 2
 * train.exit_after_min (measured from the start of this process's training), 1
 * train.stop_at_step; 0 when it does not. */
static int stop_reason(const trainer *t) {
    const ust_config *c = t->cfg;
    if (g_stop_signal) return 3;
    if (c->train.exit_after_min > 0 && log_now_s() - t->started_s >= 60 * c->train.exit_after_min)
        return 2;
    return c->train.stop_at_step > 0 && t->step >= c->train.stop_at_step;
}

/* The reason every rank agrees on: none unless some rank has one (all then stop after the same
 * step); a signal anywhere, else this rank's own, else another rank's time limit. */
static int stop_reason_any(trainer *t) {
    int why = stop_reason(t);
    if (!any_rank(t, why > 0)) return 0;
    if (any_rank(t, why == 3)) return 3; /* only on the way out: a second collective */
    return why > 0 ? why : 2;
}

static int checkpoint_or_stop(trainer *t) {
    const ust_config *c = t->cfg;
    int last = t->step == c->train.steps;
    static const char *const WHY[] = {"", "train.stop_at_step reached",
                                      "time limit (train.exit_after_min) reached",
                                      "received signal"};
    int why = stop_reason_any(t), stop = why > 0;
    /* every: 0 turns off the periodic checkpoints only; a stop always writes one */
    int periodic = c->checkpoint.every > 0 && (t->step % c->checkpoint.every == 0 || last);
    ust_err e;
    if (c->checkpoint.dir[0] && (periodic || stop) && save_checkpoint(t, &e)) {
        fprintf(stderr, "ustrain: error: checkpoint at step %lld failed: %s\n", (long long)t->step,
                e.msg);
        return -1;
    }
    if (stop && t->rank0)
        printf("%s: stopped after step %lld%s (a signal (SIGTERM/SIGUSR1) or time limit on any "
               "rank stops every rank after the same step)\n",
               WHY[why], (long long)t->step, c->checkpoint.dir[0] ? ", checkpoint written" : "");
    return stop;
}

/* train.on_spike: is this step's loss or gradient norm a spike against the recent steps? Both are
 * global, so every rank decides the same. A step that is not one joins the windows. */
static int is_spike(trainer *t, double loss, double norm) {
    const ust_config *c = t->cfg;
    if (c->train.on_spike == SPIKE_NONE) return 0;
    double zl = spike_z(&t->loss_w, loss), zn = spike_z(&t->norm_w, norm);
    if (zl > c->train.spike_zscore || zn > c->train.spike_zscore) {
        if (t->rank0)
            printf("spike at step %lld: loss %.4f (z %.1f), grad norm %.3f (z %.1f) over the last "
                   "%d steps, samples [%lld, %lld)\n",
                   (long long)t->step + 1, loss, zl, norm, zn, c->train.spike_window,
                   (long long)t->sample_index,
                   (long long)(t->sample_index + c->train.global_batch_size));
        return 1;
    }
    spike_push(&t->loss_w, loss);
    spike_push(&t->norm_w, norm);
    return 0;
}

/* train.on_spike: rewind: the newest checkpoint's weights and moments, its step, and the data
 * from after the spike on (batch_since marks where the run's data position jumped). Without a
 * checkpoint yet, the spike's update is only skipped. */
static int rewind_to_checkpoint(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    char dir[UST_PATH_MAX + 64];
    if (finish_pending(t, 1, e)) return -1;
    int found = c->checkpoint.dir[0] ? verified_checkpoint(t, NULL, dir, sizeof dir, e) : 0;
    if (found < 0) return -1;
    if (!found) {
        if (t->rank0) printf("spike: no checkpoint to rewind to yet; the update is skipped\n");
        return 0;
    }
    ckpt_reader *r = ckpt_open(dir, e);
    ckpt_state st;
    int rc = r ? ckpt_parse_state(ckpt_state_json(r), dir, &st, e) : -1;
    if (rc == 0) rc = dp_load(t->dp, r, e);
    if (r) ckpt_close(r);
    if (rc) return -1;
    if (t->rank0)
        printf("spike: rewound to %s (step %lld); the data goes on from sample %lld\n", dir,
               (long long)st.step, (long long)t->sample_index);
    t->step = st.step;
    t->batch_since_step = st.step;
    t->batch_since_sample = t->sample_index;
    return 0;
}

/* Test fault UST_FAULT_HANG_STEP=N (with UST_FAULT_HANG_RANK=R, default 1): global rank R loops
 * in compute at step N, forever, as a rank stuck in a kernel would; its peers must name it. */
static void fault_hang(const trainer *t) {
    const char *step = getenv("UST_FAULT_HANG_STEP"), *rank = getenv("UST_FAULT_HANG_RANK");
    if (!step || atoll(step) != t->step + 1 || t->rt->rank != (rank ? atoi(rank) : 1)) return;
    for (volatile uint64_t spin = 0;; spin++) {
    }
}

/* Test fault UST_FAULT_DIE_STEP=N (UST_FAULT_DIE_RANK=R, default 1): global rank R dies
 * (SIGKILL) at step N, on a job's first start only (UST_RESTART_COUNT unset or 0). */
static void fault_die(const trainer *t) {
    const char *step = getenv("UST_FAULT_DIE_STEP"), *rank = getenv("UST_FAULT_DIE_RANK");
    if (step && atoll(step) == t->step + 1 && t->rt->rank == (rank ? atoi(rank) : 1) &&
        t->restarts == 0)
        raise(SIGKILL);
}

/* One step: forward and backward, the norm, the update (unless skipped or stopped). Returns 0,
 * or UST_EXIT_RUNTIME for a non-finite loss under on_nan: stop. *spiked: train.on_spike found a
 * spike, whose update was not made. */
static int train_step(trainer *t, double *loss, double *norm, double *lr, int *finite,
                      int *spiked) {
    const ust_config *c = t->cfg;
    fault_hang(t);
    fault_die(t);
    *loss = forward_backward(t);
    *norm = dp_grad_norm(t->dp);
    *lr = optim_lr(c, t->step);
    *finite = isfinite(*loss) && isfinite(*norm);
    *spiked = *finite && is_spike(t, *loss, *norm);
    if (!*finite && c->train.on_nan == ONNAN_STOP) {
        if (t->rank0)
            fprintf(stderr,
                    "ustrain: error: non-finite %s at step %lld (loss %g, grad norm %g); stopping "
                    "(train.on_nan: stop)\n",
                    isfinite(*loss) ? "gradient norm" : "loss", (long long)t->step + 1, *loss,
                    *norm);
        return UST_EXIT_RUNTIME;
    }
    if (*finite && !*spiked) dp_optimizer_step(t->dp, *lr, optim_clip_scale(c, *norm), t->step);
    if (t->has_moe) /* dualpipe: the mirror's copies of these layers routed the other half */
        model_moe_end_step(t->m, t->rt->topo.comm[TOPO_DPCP],
                           t->rt->topo.grid.mirror ? t->rt->topo.comm[TOPO_MIRROR] : NULL,
                           *finite && !*spiked, dp_add_to_param, t->dp);
    return 0;
}

/* train.steps: 0 on a fresh start measures the starting weights (an import, or the init) on the
 * validation set and writes them as checkpoint step 0 (unless checkpoint.every is 0): an import
 * converted, ready to export. */
static int step_zero(trainer *t) {
    const ust_config *c = t->cfg;
    if (t->val) {
        double vl = validation_loss(t);
        if (t->rank0) printf("step 0: val_loss %.7f (the starting weights)\n", vl);
    }
    ust_err e;
    if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && save_checkpoint(t, &e)) {
        fprintf(stderr, "ustrain: error: checkpoint at step 0 failed: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static int loop(trainer *t, const train_opts *opts, train_result *res) {
    const ust_config *c = t->cfg;
    double tokens = (double)c->train.global_batch_size * c->train.seq_len;
    double fpt = model_flops_per_token(t->m), peak = peak_flops(t), sum_ms = 0,
           t_start = log_now_s();
    int64_t first = t->step, timed = 0, allocs_after_first = -1;
    res->peak_flops = peak;
    res->flops_per_token = fpt;
    int untimed = opts->untimed_steps > 0 ? opts->untimed_steps : 1;
    int all_timed = c->train.steps - first <= untimed;
    /* a stop asked for during start-up: nothing was trained, so nothing needs saving */
    if (t->step < c->train.steps && any_rank(t, g_stop_signal != 0)) {
        if (t->rank0)
            printf("received signal before the first step: stopped, nothing to checkpoint\n");
        return UST_EXIT_OK;
    }
    if (c->train.steps == 0 && t->fresh && step_zero(t)) return UST_EXIT_RUNTIME;
    while (t->step < c->train.steps) {
        /* the op profiler (--profile) counts the timed steps only */
        if (opts->profile && (t->step == first + untimed || (all_timed && t->step == first)))
            ops_prof_enable(t->ops, 1);
        step_mark mark = mark_step(t);
        double loss, norm, lr;
        int finite, spiked;
        assign_step(t);
        if (train_step(t, &loss, &norm, &lr, &finite, &spiked)) return UST_EXIT_RUNTIME;
        log_step s = report_step(t, &mark, loss, norm, lr, finite, fpt, peak);
        s.spike = spiked ? (int)c->train.on_spike : 0;
        s.restarts = t->restarts;
        double raised = raise_measured_peak(t, peak, fpt, &s);
        if (raised > peak) s.mfu *= peak / raised, peak = raised;
        t->step++;
        t->sample_index += c->train.global_batch_size;
        t->last_loss = loss;
        if (t->step == first + 1) allocs_after_first = device_allocations(t);
        if (t->step > first + untimed || all_timed) sum_ms += s.ms, timed++;
        s.eta_s = (log_now_s() - t_start) / (t->step - first) * (c->train.steps - t->step);
        s.elapsed_s = log_now_s() - t_start;
        s.data_n = data_blend_count(t->train) > 1 ? data_blend_count(t->train) : 0;
        for (int d = 0; d < s.data_n; d++) s.data_samples[d] = t->pos.consumed[d];
        s.samples_seen = t->sample_index;
        s.tokens_seen = t->sample_index * c->train.seq_len;
        int last = t->step == c->train.steps;
        if (t->val && (t->step % c->data.val_every == 0 || last)) s.val_loss = validation_loss(t);
        if (t->rank0 && !opts->quiet &&
            (t->step % c->logging.every == 0 || last || !isnan(s.val_loss))) {
            log_step_line(&s);
            log_step_json(&t->log, &s);
        }
        ust_err e;
        if (spiked && c->train.on_spike == SPIKE_REWIND && rewind_to_checkpoint(t, &e)) {
            fprintf(stderr, "ustrain: error: spike: cannot rewind: %s\n", e.msg);
            return UST_EXIT_RUNTIME;
        }
        if (finish_pending(t, 0, &e)) {
            fprintf(stderr, "ustrain: error: checkpoint at step %lld failed: %s\n",
                    (long long)t->pending_step, e.msg);
            return UST_EXIT_RUNTIME;
        }
        int after = checkpoint_or_stop(t);
        if (after < 0) return UST_EXIT_RUNTIME;
        if (after) break;
    }
    ust_err e;
    double waited = t->ckpt_wait_s, t_end = log_now_s();
    if (finish_pending(t, 1, &e)) { /* the last save completes before the run ends */
        fprintf(stderr, "ustrain: error: checkpoint at step %lld failed: %s\n",
                (long long)t->pending_step, e.msg);
        return UST_EXIT_RUNTIME;
    }
    res->steps_done = t->step - first;
    if (t->rank0 && !opts->quiet && t->ckpt_saves && t->stage)
        printf("checkpoints: %d saved (async); per save the step loop spent %.1f ms staging and "
               "%.1f ms waiting for the previous write; %.1f ms after the last step for the last\n",
               t->ckpt_saves, 1e3 * t->ckpt_save_s / t->ckpt_saves, 1e3 * waited / t->ckpt_saves,
               1e3 * (log_now_s() - t_end));
    else if (t->rank0 && !opts->quiet && t->ckpt_saves)
        printf("checkpoints: %d saved (synchronous); per save the step loop spent %.1f ms writing\n",
               t->ckpt_saves, 1e3 * t->ckpt_save_s / t->ckpt_saves);
    res->final_loss = t->last_loss;
    if (allocs_after_first >= 0)
        res->device_allocs_after_first_step = device_allocations(t) - allocs_after_first;
    res->timed_steps = timed;
    res->mean_step_ms = timed ? sum_ms / timed : 0;
    res->tokens_per_s = timed ? tokens / (res->mean_step_ms / 1e3) : 0;
    res->peak_flops = peak;
    res->mfu = res->tokens_per_s * fpt / (peak * t->rt->world);
    return UST_EXIT_OK;
}

/* Training on from a checkpoint: its data position counts sequences of the train.seq_len it was
 * trained with, so another one would re-read (or skip) tokens; eval reads val only and may. */
static int check_seq_len(const trainer *t, ust_err *e) {
    int was = t->resumed_seq_len, now = t->cfg->train.seq_len;
    if (!was || was == now) return 0;
    return ust_errf(e,
                    "train.seq_len = %d, but the checkpoint was trained with %d: its data position "
                    "(%lld sequences) counts sequences of %d tokens, so training on would read "
                    "tokens again or skip them; keep train.seq_len: %d (or start over with "
                    "checkpoint.resume: none)",
                    now, was, (long long)t->sample_index, was, was);
}

static int run_with(const ust_config *cfg, ust_runtime *rt, const train_opts *opts,
                    train_result *res) {
    trainer t;
    ust_err e;
    /* Setup failures are usage errors found before training; ranks exit on their own (a rank
     * whose peers failed waits at most dist.timeout_s in its next collective). */
    if (setup(&t, cfg, rt, opts->profile, &e) || check_seq_len(&t, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        teardown(&t);
        return UST_EXIT_USAGE;
    }
    char err[1024];
    if (t.rank0 && !opts->quiet &&
        log_open(&t.log, cfg->logging.metrics_file, cfg->logging.tensorboard_dir, t.step, err,
                 sizeof err)) {
        fprintf(stderr, "ustrain: error: %s\n", err);
        teardown(&t);
        return UST_EXIT_USAGE;
    }
    if (t.rank0 && opts->write_config) write_effective_config(cfg);
    mem_plan plan;
    plan_memory(cfg, &plan);
    if (t.rank0 && !opts->quiet) {
        char b1[32], b2[32];
        printf("ustrain: %s %s, %lld parameters, %lld steps of %d x %d tokens (grad accum %d); "
               "memory %s (plan %s)\n",
               cfg->run.name, cfg->model.arch == ARCH_GPT2 ? "gpt2" : "llama",
               (long long)plan.n_params, (long long)cfg->train.steps, cfg->train.global_batch_size,
               cfg->train.seq_len, cfg_grad_accum(cfg), log_bytes(b1, 32, t.arena.total),
               log_bytes(b2, 32, plan.total));
        if (t.stage)
            printf("checkpoint.async: staging buffer %lld bytes of host memory (plan %.0f)\n",
                   (long long)ckpt_stage_bytes(t.stage), plan.ckpt_staging);
    }
    train_install_stop_handlers(); /* `ustrain train` did already, before the bootstrap */
    int rc = loop(&t, opts, res);
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    g_stop_signal = 0; /* a later run in this process starts afresh */
    res->arena_bytes = (double)t.arena.total;
    for (int i = 0; i < MEM_NCAT && i < 6; i++) res->arena_by_cat[i] = (double)t.arena.bytes[i];
    res->peak_rss = mem_peak_rss_bytes();
    if (cfg->run.device == DEV_CUDA) {
        ops_mem m;
        t.backend->memory(t.backend, &m);
        res->device_backend_bytes = m.backend_bytes;
        res->device_used = m.device_used;
    }
    if (rc == 0 && t.rank0 && !opts->quiet && res->steps_done > 0) {
        char b[32];
        printf("done: %lld steps, final loss %.4f, %.1f ms/step, %.0f tok/s, mfu %.1f%%, "
               "peak RSS %s\n",
               (long long)res->steps_done, res->final_loss, res->mean_step_ms, res->tokens_per_s,
               100 * res->mfu, log_bytes(b, 32, (double)res->peak_rss));
        if (cfg->run.device == DEV_CUDA) {
            char b1[32], b3[32];
            printf("device memory: arena %s + backend scratch %s; %s in use on the device; %lld "
                   "device allocations after the first step\n",
                   log_bytes(b1, 32, (double)t.arena.total),
                   log_bytes(b3, 32, (double)res->device_backend_bytes),
                   log_bytes(b, 32, (double)res->device_used),
                   (long long)res->device_allocs_after_first_step);
        }
    }
    if (rc == 0 && t.rank0 && opts->profile && res->timed_steps > 0) {
        printf("per-op time on rank 0, mean of the %lld timed steps (each op between two syncs "
               "of the backend%s):\n",
               (long long)res->timed_steps,
               cfg->run.device == DEV_CUDA ? ", which the step times above include" : "");
        ops_prof_print(t.ops, stdout, (int)res->timed_steps);
    }
    teardown(&t);
    return rc;
}

int train_run(const ust_config *cfg, ust_runtime *rt, const train_opts *opts, train_result *res) {
    train_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    if (rt) return run_with(cfg, rt, opts, res);
    ust_runtime own;
    ust_err e;
    if (train_runtime_init(&own, cfg, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    int rc = run_with(cfg, &own, opts, res);
    train_runtime_finalize(&own);
    return rc;
}

/* Evaluation: the run set up as for training (the checkpoint resumed, or model.init_from), then
 * one validation pass over data.val, nothing trained or written. */
int train_eval(const ust_config *cfg, ust_runtime *rt, double *loss) {
    trainer t;
    ust_err e;
    int rc = setup(&t, cfg, rt, 0, &e);
    if (rc == 0 && !t.val) rc = ust_errf(&e, "eval: no data.val to evaluate (val_steps 0?)");
    if (rc) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    if (rc == 0) *loss = validation_loss(&t);
    teardown(&t);
    return rc ? UST_EXIT_USAGE : 0;
}
