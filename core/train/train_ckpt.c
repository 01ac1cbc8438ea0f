/* train_ckpt.c: the trainer's checkpoints: what to start from (resume, import, init), when to
 * save (checkpoint.every, a stop), async saves in flight, rewinds after a spike, and the stop
 * requests (SIGTERM/SIGUSR1, time and step limits) that end a run with a checkpoint. */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "error.h"
#include "hf_import.h"
#include "train_internal.h"

/* Set by SIGTERM/SIGUSR1 and read between steps: the only state a signal handler may touch. */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

int train_stop_asked(void) { return g_stop_signal != 0; }

void train_install_stop_handlers(void) {
    signal(SIGTERM, on_stop_signal);
    signal(SIGUSR1, on_stop_signal);
}

/* When train_run returns: the default handlers again, and a later run in this process starts
 * afresh. */
void train_stop_handlers_reset(void) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    g_stop_signal = 0;
}

/* The lowest rank whose `failed` is set and, into msg, its message (this rank's on the way in).
 * Only on the failure path: the buffer is the backend's, outside the arena the plan counts. */
#define REASON_BYTES 1024
static int first_failed_rank(trainer *t, int failed, char *msg, size_t cap) {
    int n = t->rt->world;
    size_t floats = REASON_BYTES / sizeof(float);
    char *host = calloc((size_t)n + 1, REASON_BYTES);
    float *dev = t->eng.ops->alloc(t->eng.ops, ((size_t)n + 1) * REASON_BYTES);
    UST_ASSERT(host, "out of memory for %d reasons", n);
    if (failed) snprintf(host, REASON_BYTES, "%s", msg ? msg : "");
    host[0] = failed ? (host[0] ? host[0] : ' ') : 0; /* an empty string means "not failed" */
    t->eng.ops->to_device(t->eng.ops, dev, host, REASON_BYTES);
    comm_req r = comm_allgather(t->rt->topo.comm[TOPO_WORLD], dev, dev + floats, floats, COMM_FP32);
    comm_wait(&r); /* raw bytes: a gather copies, it never computes on them */
    t->eng.ops->to_host(t->eng.ops, host + REASON_BYTES, dev + floats, (size_t)n * REASON_BYTES);
    int first = -1;
    for (int i = 0; i < n && first < 0; i++)
        if (host[(size_t)(i + 1) * REASON_BYTES]) first = i;
    if (first >= 0 && msg && cap) {
        char *m = host + (size_t)(first + 1) * REASON_BYTES;
        m[REASON_BYTES - 1] = 0;
        snprintf(msg, cap, "%s", m);
    }
    t->eng.ops->free(t->eng.ops, dev);
    free(host);
    return first;
}

/* The checkpoint writer's barrier (ckpt_sync_fn). */
static int world_sync(void *arg, int failed, char *msg, size_t cap) {
    trainer *t = arg;
    if (!train_any_rank(t, failed)) return -1;
    if (t->rt->world == 1 || !msg) return 0; /* without msg: whether any, not which */
    return first_failed_rank(t, failed, msg, cap);
}

/* The tokenizer the training data was made with, for export to ship beside the model: from the
 * meta.json data prep writes beside the shards (data_meta_read's, of data.train's glob; of a
 * blend, its first dataset's), as {"path", "sha256", "eot_id"}; NULL when there is none, it
 * names no tokenizer, or it cannot be read (train checked it at the start: data_check_meta). */
static cJSON *data_tokenizer(const ust_config *c) {
    cfg_dataset sets[CFG_MAX_BLEND];
    data_meta meta;
    ust_err e;
    if (cfg_data_sets(c, 0, sets) < 1 || data_meta_read(sets[0].path, &meta, &e) < 1 ||
        !meta.tokenizer[0])
        return NULL;
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "path", meta.tokenizer);
    if (meta.tokenizer_sha256[0]) cJSON_AddStringToObject(out, "sha256", meta.tokenizer_sha256);
    if (meta.eot_id >= 0)
        cJSON_AddNumberToObject(out, "eot_id", meta.eot_id);
    else
        cJSON_AddNullToObject(out, "eot_id");
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
    cJSON_AddNumberToObject(since, "global_batch_size",
                            t->batch_size ? t->batch_size : c->train.global_batch_size);
    data_blend_save(t->feed.train, &t->feed.pos, j);
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
int train_ckpt_poll(trainer *t, int block, ust_err *e) {
    if (!t->ck.pending) return 0;
    double t0 = log_now_s();
    int rc = ckpt_poll(t->ck.pending, block, e);
    t->ck.wait_s += log_now_s() - t0;
    if (rc == 1) return 0;
    t->ck.pending = NULL;
    train_trace_ckpt_write(t);
    if (rc == 0 && t->rank0)
        printf("checkpoint step_%lld committed (written in the background during %lld step%s)\n",
               (long long)t->ck.pending_step, (long long)(t->step - t->ck.pending_started),
               t->step - t->ck.pending_started == 1 ? "" : "s");
    return rc;
}

/* Writes step t->step: synchronously, or (checkpoint.async) staged and handed to the writer
 * thread, after the previous async save has completed. */
int train_ckpt_save(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    if (train_ckpt_poll(t, 1, e)) return -1;
    double t0 = log_now_s();
    ckpt_writer *w =
        ckpt_begin(c->checkpoint.dir, t->step, t->rt->rank, t->rt->boot.job_id, world_sync, t, e);
    if (!w) return -1;
    if (t->ck.stage) ckpt_set_stage(w, t->ck.stage), ckpt_set_times(w, t->ck.pending_s);
    dp_save(t->eng.dp, w, e); /* a failure is sticky in w: the commit reports it on every rank */
    char *state = t->rank0 ? state_json(t) : NULL;
    int rc = t->ck.stage ? ckpt_commit_async(w, state, c->checkpoint.keep_last, e)
                         : ckpt_commit(w, state, c->checkpoint.keep_last, e);
    if (t->ck.stage && rc == 0)
        t->ck.pending = w, t->ck.pending_step = t->ck.pending_started = t->step;
    free(state);
    t->ck.save_s += log_now_s() - t0;
    t->ck.saves++;
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
    int rc = data_blend_restore(t->feed.train, state, st.sample_index, c->data.allow_reweight,
                                &t->feed.pos, note, sizeof note, &why);
    cJSON_Delete(state);
    if (rc) return ust_errf(e, "checkpoint %s: %s", dir, why.msg);
    if (note[0] && t->rank0 && !t->eval) printf("%s\n", note); /* eval trains nothing */
    t->step = st.step;
    t->sample_index = st.sample_index;
    t->last_loss = st.loss;
    ust_config was; /* what the position was counted in (0: not known) */
    t->resumed_seq_len = ckpt_load_config(dir, "resume", &was, &why) == 0 ? was.train.seq_len : 0;
    /* the next step's batch (train.batch_ramp: the ramp's at this position) */
    int next = cfg_batch_at(c, st.sample_index * c->train.seq_len);
    bool same_batch = st.batch_size ? st.batch_size == next : G == next;
    t->batch_since_step = same_batch ? st.batch_since_step : st.step;
    t->batch_since_sample = same_batch ? st.batch_since_sample : st.sample_index;
    t->batch_size = next; /* batch_since's: set here, so train_feed_ramp moves nothing */
    return 0;
}

/* The optimizer state carries over only to the optimizer that made it (Muon's routers on
 * Muon or not included); from another one's checkpoint the weights carry over and the state
 * starts from zero, only when optimizer.reset_state asks. */
static int load_trainable(trainer *t, ckpt_reader *r, const char *dir, ust_err *e) {
    const ust_config *c = t->cfg;
    ust_config was;
    ust_err why;
    if (ckpt_load_config(dir, "resume", &was, &why) != 0 ||
        (!strcmp(was.optimizer.name, c->optimizer.name) &&
         (strcmp(c->optimizer.name, "muon") != 0 ||
          was.optimizer.muon_routers == c->optimizer.muon_routers)))
        return dp_load(t->eng.dp, r, e);
    if (c->optimizer.reset_state) {
        if (t->rank0)
            printf("resume: %s's optimizer state (%s) is not this run's (%s): weights loaded, "
                   "optimizer state from zero (optimizer.reset_state)\n",
                   dir, was.optimizer.name, c->optimizer.name);
        return dp_load_weights(t->eng.dp, r, e);
    }
    return ust_errf(e,
                    "checkpoint %s holds the state of optimizer.name: %s (muon_routers: %d); this "
                    "run has optimizer.name: %s (muon_routers: %d). Set optimizer.reset_state: "
                    "true to keep its weights and start the optimizer state from zero",
                    dir, was.optimizer.name, was.optimizer.muon_routers, c->optimizer.name,
                    c->optimizer.muon_routers);
}

static int load_checkpoint(trainer *t, const char *dir, ust_err *e) {
    ckpt_reader *r = ckpt_open(dir, e);
    if (!r) return -1;
    int rc = read_state(t, ckpt_state_json(r), dir, e);
    if (rc == 0) rc = load_trainable(t, r, dir, e);
    ckpt_close(r);
    return rc;
}

typedef struct {
    hf_model *h;
    progress pr; /* rank 0 on a terminal: the bytes read of the files' */
} hf_reading;

static int read_hf(void *vr, const ckpt_tensor *t, const ckpt_slice *s, float *host, ust_err *e) {
    hf_reading *r = vr;
    int rc = hf_read_slice(r->h, t, s, host, e);
    progress_update(&r->pr, (double)hf_bytes_read(r->h));
    return rc;
}

/* Every rank reads only its own slices; the figures show it (about 1/tp or 1/pp of the bytes). */
static int load_hf(trainer *t, const char *dir, ust_err *e) {
    hf_model *h = hf_open(dir, e);
    if (!h) return -1;
    hf_allow_nonfinite(h, t->cfg->model.allow_nonfinite);
    hf_reading r = {.h = h};
    progress_begin(&r.pr, "import: reading", t->rank0 ? (double)hf_tensor_bytes(h) : 0, true);
    int rc = dp_load_slices(t->eng.dp, read_hf, &r, e);
    progress_end(&r.pr);
    if (rc == 0) {
        int64_t got = hf_bytes_read(h), all = hf_tensor_bytes(h);
        printf("rank %d: imported %s: read %lld of the files' %lld tensor bytes (%.1f%%)\n",
               t->rt->rank, dir, (long long)got, (long long)all, all ? 100.0 * got / all : 0.0);
        fflush(stdout);
    }
    hf_close(h);
    return rc;
}

/* 1 when a and b train on the same datasets (paths in order; blend weights may change on a
 * resume: data.allow_reweight), 0 when they differ or cannot be compared (out of memory). */
static int same_data(const ust_config *a, const ust_config *b) {
    cfg_dataset *x = malloc(2 * CFG_MAX_BLEND * sizeof *x);
    if (!x) return 0;
    int n = cfg_data_sets(a, 0, x), same = n == cfg_data_sets(b, 0, x + CFG_MAX_BLEND);
    for (int i = 0; same && i < n; i++) same = !strcmp(x[i].path, x[CFG_MAX_BLEND + i].path);
    free(x);
    return same;
}

/* checkpoint.resume: auto goes on only from this run's own checkpoint: its run.name, model
 * shape and training data must be the config's (another config's defaults may point into the same
 * directory). A checkpoint named in checkpoint.resume is taken as asked; one recording no config is
 * left to the loader's checks. 0, or -1 naming what differs. */
static int same_run(const ust_config *c, const char *dir, ust_err *e) {
    ust_config w;
    ust_err why;
    if (ckpt_load_config(dir, "resume", &w, &why)) return 0;
    const __typeof__(c->model) *m = &c->model, *o = &w.model;
    const struct {
        const char *key;
        long long now, was;
    } k[] = {{"model.arch", m->arch, o->arch},
             {"model.n_layer", m->n_layer, o->n_layer},
             {"model.d_model", m->d_model, o->d_model},
             {"model.n_head", m->n_head, o->n_head},
             {"model.n_kv_head", m->n_kv_head, o->n_kv_head},
             {"model.d_ff", m->d_ff, o->d_ff},
             {"model.vocab_size", m->vocab_size, o->vocab_size},
             {"model.tie_embeddings", m->tie_embeddings, o->tie_embeddings},
             {"model.qkv_bias", m->qkv_bias, o->qkv_bias},
             {"model.qk_norm", m->qk_norm, o->qk_norm},
             {"model.qk_norm_whole", m->qk_norm_whole, o->qk_norm_whole},
             {"model.post_norm", m->post_norm, o->post_norm},
             {"model.head_dim", m->head_dim, o->head_dim},
             {"model.sandwich_norm", m->gemma.sandwich_norm, o->gemma.sandwich_norm},
             {"model.norm_offset", m->gemma.norm_offset, o->gemma.norm_offset},
             {"model.hidden_act", m->gemma.hidden_act, o->gemma.hidden_act},
             {"model.attn_softcap (millionths)", (long long)(m->gemma.attn_softcap * 1e6),
              (long long)(o->gemma.attn_softcap * 1e6)},
             {"model.final_softcap (millionths)", (long long)(m->gemma.final_softcap * 1e6),
              (long long)(o->gemma.final_softcap * 1e6)},
             {"model.partial_rotary_factor (millionths)",
              (long long)(m->partial_rotary_factor * 1e6),
              (long long)(o->partial_rotary_factor * 1e6)},
             {"model.moe.num_experts", m->moe.num_experts, o->moe.num_experts},
             {"model.moe.d_ff_expert", m->moe.d_ff_expert, o->moe.d_ff_expert},
             {"model.moe.every", m->moe.every, o->moe.every},
             {"model.moe.first_dense", m->moe.first_dense, o->moe.first_dense},
             {"model.moe.shared_expert", m->moe.shared_expert, o->moe.shared_expert}};
    char diff[1024] = "";
    size_t n = 0;
    if (strcmp(c->run.name, w.run.name))
        n += snprintf(diff, sizeof diff, "run.name '%s' (the checkpoint's '%s')", c->run.name,
                      w.run.name);
    if (!same_data(c, &w) && n < sizeof diff)
        n += snprintf(diff + n, sizeof diff - n, "%sdata.train %s (the checkpoint's %s)",
                      n ? ", " : "", c->data.train, w.data.train);
    for (size_t i = 0; i < sizeof k / sizeof k[0] && n < sizeof diff; i++)
        if (k[i].now != k[i].was)
            n += snprintf(diff + n, sizeof diff - n, "%s%s %lld (the checkpoint's %lld)",
                          n ? ", " : "", k[i].key, k[i].now, k[i].was);
    if (!diff[0]) return 0;
    return ust_errf(e,
                    "checkpoint.resume: auto found %s in checkpoint.dir %s, another run's: %s; "
                    "give this run its own checkpoint.dir (run.out_dir, run.name), or name the "
                    "checkpoint in checkpoint.resume to start from it anyway",
                    dir, c->checkpoint.dir, diff);
}

/* Finds what to start from: a checkpoint (resume), a Hugging Face directory or an llm.c file,
 * or a fresh init. */
int train_ckpt_initialize(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    char dir[UST_PATH_MAX + 64] = "";
    int found = 0;
    if (strcmp(c->checkpoint.resume, "none") != 0) {
        int named = strcmp(c->checkpoint.resume, "auto") != 0;
        found = verified_checkpoint(t, named ? c->checkpoint.resume : NULL, dir, sizeof dir, e);
        if (found < 0 || (found && !named && same_run(c, dir, e))) return -1;
    }
    if (found) {
        if (load_checkpoint(t, dir, e)) return -1;
        if (t->rank0 && !t->eval)
            printf("resuming from %s (step %lld, sample %lld)\n", dir, (long long)t->step,
                   (long long)t->sample_index);
        return 0;
    }
    t->fresh = 1;
    if (hf_is_model_dir(c->model.init_from)) return load_hf(t, c->model.init_from, e);
    if (c->model.init_from[0]) return dp_load_llmc(t->eng.dp, c->model.init_from, e);
    dp_init_params(t->eng.dp, c->run.seed);
    return 0;
}

/* checkpoint.async: the staging buffer, sized for what this rank writes, from the backend's host
 * memory (page-locked on CUDA) or, when it has none to give, ordinary memory. */
int train_ckpt_open_stage(trainer *t, ust_err *e) {
    int64_t bytes = dp_save_bytes(t->eng.dp);
    t->ck.stage_buf = t->eng.backend->host_alloc(t->eng.backend, (size_t)bytes);
    t->ck.stage =
        t->ck.stage_buf ? ckpt_stage_wrap(t->ck.stage_buf, bytes, e) : ckpt_stage_create(bytes, e);
    return t->ck.stage ? 0 : -1;
}

/* Why this rank wants to stop after the step, most urgent first: 3 a signal, 2
 * train.exit_after_min (measured from the start of this process's training), 1
 * train.stop_at_step; 0 when it does not. */
static int stop_reason(const trainer *t) {
    const ust_config *c = t->cfg;
    if (g_stop_signal) return 3;
    if (c->train.exit_after_min > 0 &&
        log_now_s() - t->ck.started_s >= 60 * c->train.exit_after_min)
        return 2;
    return c->train.stop_at_step > 0 && t->step >= c->train.stop_at_step;
}

/* The reason every rank agrees on: none unless some rank has one (all then stop after the same
 * step); a signal anywhere, else this rank's own, else another rank's time limit. */
static int stop_reason_any(trainer *t) {
    int why = stop_reason(t);
    if (!train_any_rank(t, why > 0)) return 0;
    if (train_any_rank(t, why == 3)) return 3; /* only on the way out: a second collective */
    return why > 0 ? why : 2;
}

/* After a step: a periodic checkpoint, or the one a stop asks for (every rank stops after the
 * same step: a signal to any of them counts). 1: stop now; -1: the checkpoint failed. */
int train_ckpt_after_step(trainer *t) {
    const ust_config *c = t->cfg;
    int last = t->step == c->train.steps;
    static const char *const WHY[] = {"", "train.stop_at_step reached",
                                      "time limit (train.exit_after_min) reached",
                                      "received signal"};
    int why = stop_reason_any(t), stop = why > 0;
    /* every: 0 turns off the periodic checkpoints only; a stop always writes one */
    int periodic = c->checkpoint.every > 0 && (t->step % c->checkpoint.every == 0 || last);
    ust_err e;
    if (c->checkpoint.dir[0] && (periodic || stop) && train_ckpt_save(t, &e)) {
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

/* train.on_spike: rewind: the newest checkpoint's weights and moments, its step, and the data
 * from after the spike on (batch_since marks where the run's data position jumped): a repeated
 * rewind never sees the offending samples again. More than train.max_rewinds rewinds to the same
 * checkpoint in a row stop the run (data that spikes at every step would rewind forever). Without
 * a checkpoint yet, the spike's update is only skipped. */
static int rewind_bound(trainer *t, const ckpt_state *st, const char *dir, ust_err *e) {
    if (t->ck.rewinds == 0 || t->ck.rewound_to != st->step) t->ck.rewinds = 0;
    t->ck.rewound_to = st->step;
    if (++t->ck.rewinds <= t->cfg->train.max_rewinds) return 0;
    return ust_errf(e,
                    "spike at step %lld: rewind %d to %s (step %lld) in a row is more than "
                    "train.max_rewinds = %d (each went on with new data and spiked again: the "
                    "data or the learning rate?); stopping",
                    (long long)t->step, t->ck.rewinds, dir, (long long)st->step,
                    t->cfg->train.max_rewinds);
}

int train_ckpt_rewind(trainer *t, ust_err *e) {
    const ust_config *c = t->cfg;
    char dir[UST_PATH_MAX + 64];
    if (train_ckpt_poll(t, 1, e)) return -1;
    int found = c->checkpoint.dir[0] ? verified_checkpoint(t, NULL, dir, sizeof dir, e) : 0;
    if (found < 0) return -1;
    if (!found) {
        if (t->rank0) printf("spike: no checkpoint to rewind to yet; the update is skipped\n");
        return 0;
    }
    ckpt_reader *r = ckpt_open(dir, e);
    ckpt_state st;
    int rc = r ? ckpt_parse_state(ckpt_state_json(r), dir, &st, e) : -1;
    if (rc == 0) rc = rewind_bound(t, &st, dir, e);
    if (rc == 0) rc = load_trainable(t, r, dir, e);
    if (r) ckpt_close(r);
    if (rc) return -1;
    if (t->rank0)
        printf("spike: rewound to %s (step %lld); the data goes on from sample %lld\n", dir,
               (long long)st.step, (long long)t->sample_index);
    t->step = st.step;
    t->batch_since_step = st.step;
    t->batch_since_sample = t->sample_index;
    t->batch_size = 0; /* the next step's batch is set from here without moving batch_since */
    return 0;
}

/* Training on from a checkpoint: its data position counts sequences of the train.seq_len it was
 * trained with, so another one would re-read (or skip) tokens; eval reads val only and may. */
int train_ckpt_check_seq_len(const trainer *t, ust_err *e) {
    int was = t->resumed_seq_len, now = t->cfg->train.seq_len;
    if (!was || was == now) return 0;
    return ust_errf(e,
                    "train.seq_len = %d, but the checkpoint was trained with %d: its data position "
                    "(%lld sequences) counts sequences of %d tokens, so training on would read "
                    "tokens again or skip them; keep train.seq_len: %d (or start over with "
                    "checkpoint.resume: none)",
                    now, was, (long long)t->sample_index, was, was);
}

/* A run ending on an error: its save in flight is not published; the lock is given back. */
void train_ckpt_close(trainer *t) {
    ckpt_abort(t->ck.pending);
    ckpt_stage_free(t->ck.stage);
    if (t->ck.stage_buf) t->eng.backend->host_free(t->eng.backend, t->ck.stage_buf);
    ckpt_unlock_dir(&t->ck.lock);
}

/* After the last step: the last save completes before the run ends, and rank 0 tells what the
 * saves cost the step loop. */
int train_ckpt_finish(trainer *t, int quiet) {
    ust_err e;
    double waited = t->ck.wait_s, t_end = log_now_s();
    if (train_ckpt_poll(t, 1, &e)) {
        fprintf(stderr, "ustrain: error: checkpoint at step %lld failed: %s\n",
                (long long)t->ck.pending_step, e.msg);
        return -1;
    }
    int n = t->ck.saves;
    if (t->rank0 && !quiet && n && t->ck.stage)
        printf("checkpoints: %d saved (async); per save the step loop spent %.1f ms staging and "
               "%.1f ms waiting for the previous write; %.1f ms after the last step for the last\n",
               n, 1e3 * t->ck.save_s / n, 1e3 * waited / n, 1e3 * (log_now_s() - t_end));
    else if (t->rank0 && !quiet && n)
        printf(
            "checkpoints: %d saved (synchronous); per save the step loop spent %.1f ms writing\n",
            n, 1e3 * t->ck.save_s / n);
    return 0;
}
