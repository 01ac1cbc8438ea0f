#include "log.h"

#include "error.h"
#include "fs.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ TensorBoard event files
 * A file is a sequence of records: uint64 length, uint32 masked CRC32C of the length's bytes,
 * the data, uint32 masked CRC32C of the data (TFRecord). Each record is one Event protobuf:
 * wall_time (field 1, double), step (2, int64), then file_version (3, "brain.Event:2"), a
 * summary (5: repeated value (1): tag (1, string), simple_value (2, float)) or a session_log
 * (7: status (1) START = 1, after which TensorBoard drops what earlier files logged for later
 * steps). Encoded by hand: the handful of fields needs no protobuf library. */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: records are ~1 KB a step. */
static uint32_t crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

typedef struct {
    uint8_t buf[16384];
    size_t n;
    int overflow;
} pbuf;

static void pb_bytes(pbuf *b, const void *p, size_t n) {
    if (b->n + n > sizeof b->buf) {
        b->overflow = 1;
        return;
    }
    memcpy(b->buf + b->n, p, n);
    b->n += n;
}

static void pb_varint(pbuf *b, uint64_t v) {
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, t, n);
}

/* field number f with wire type w: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit */
static void pb_key(pbuf *b, int f, int w) { pb_varint(b, (uint64_t)f << 3 | (uint64_t)w); }

static void pb_len(pbuf *b, int f, const void *p, size_t n) {
    pb_key(b, f, 2);
    pb_varint(b, n);
    pb_bytes(b, p, n);
}

/* little-endian fixed-width fields (x86-64 and aarch64 Linux are little-endian) */
static void pb_double(pbuf *b, int f, double v) {
    pb_key(b, f, 1);
    pb_bytes(b, &v, 8);
}

static void pb_float(pbuf *b, int f, float v) {
    pb_key(b, f, 5);
    pb_bytes(b, &v, 4);
}

static double unix_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A failed write of a log file: warned once per file (training goes on without the lost
 * records), or, under logging.strict, said once and recorded in l->failed: the training loop
 * stops every rank at the step's end (train.c:run_step), so no peer is left waiting for a rank
 * that exited on its own. */
static void write_failed(ust_log *l, const char *what, const char *path, bool *warned, int err) {
    if (*warned) return;
    if (l->strict) {
        *warned = l->failed = true;
        fprintf(stderr, "ustrain: error: %s %s: write failed: %s (logging.strict: true)\n", what,
                path, strerror(err));
        return;
    }
    *warned = true;
    fprintf(stderr,
            "ustrain: warning: %s %s: write failed: %s; training goes on, its records from here "
            "may be missing (logging.strict: true stops the run instead)\n",
            what, path, strerror(err));
}

/* 0 when f took everything written since the last check (flushed); else -1 with errno. */
static int flush_checked(FILE *f) {
    errno = 0;
    int rc = fflush(f) != 0 || ferror(f) ? -1 : 0;
    int err = errno ? errno : EIO;
    clearerr(f);
    errno = err;
    return rc;
}

/* An Event's header: wall_time (unix seconds, a double: the only exact place for it) and step. */
static void tb_event_head(pbuf *ev, int64_t step, double wall_time) {
    ev->n = 0;
    ev->overflow = 0;
    pb_double(ev, 1, wall_time);
    pb_key(ev, 2, 0);
    pb_varint(ev, (uint64_t)step);
}

static void tb_write(ust_log *l, const pbuf *ev) {
    FILE *f = l->tb;
    if (!f || ev->overflow) return;
    uint64_t len = ev->n;
    uint32_t lcrc = masked_crc((const uint8_t *)&len, 8), dcrc = masked_crc(ev->buf, ev->n);
    fwrite(&len, 8, 1, f);
    fwrite(&lcrc, 4, 1, f);
    fwrite(ev->buf, 1, ev->n, f);
    fwrite(&dcrc, 4, 1, f);
    if (flush_checked(f))
        write_failed(l, "TensorBoard event file", l->tb_path, &l->warned_tb, errno);
}

/* summary.value { tag, simple_value } */
static void tb_value(pbuf *summary, const char *tag, double v) {
    pbuf val = {.n = 0};
    pb_len(&val, 1, tag, strlen(tag));
    pb_float(&val, 2, (float)v);
    if (val.overflow) summary->overflow = 1;
    pb_len(summary, 1, val.buf, val.n);
}

static int tb_open(ust_log *l, const char *dir, int64_t resume_step, char *err, int errlen) {
    ust_err e;
    if (fs_mkdir_p(dir, &e)) {
        snprintf(err, errlen, "logging.tensorboard_dir %s: %s", dir, e.msg);
        return -1;
    }
    char host[256] = "localhost", path[4400];
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)unix_now_s(),
             host, (int)getpid());
    snprintf(l->tb_path, sizeof l->tb_path, "%s", path);
    if (!(l->tb = fs_fopen_regular(path, "ab", &e))) {
        snprintf(err, errlen, "logging.tensorboard_dir: %s", e.msg);
        return -1;
    }
    pbuf ev;
    tb_event_head(&ev, 0, unix_now_s());
    pb_len(&ev, 3, "brain.Event:2", 13);
    tb_write(l, &ev);
    if (resume_step > 0) { /* steps after resume_step, which earlier files hold, are superseded */
        tb_event_head(&ev, resume_step + 1, unix_now_s());
        uint8_t start[2] = {0x08, 0x01}; /* status = START */
        pb_len(&ev, 7, start, 2);
        tb_write(l, &ev);
    }
    return 0;
}

/* ------------------------------------------------------------------ the metrics file */

/* The step a metrics line is for, or -1 for a line that is not one (a partial last line). */
static int64_t line_step(const char *line, ssize_t n) {
    long long step;
    if (n < 2 || line[n - 1] != '\n' || sscanf(line, "{\"step\":%lld", &step) != 1) return -1;
    return step;
}

/* Rewrites path without the lines of steps after `after` (and partial lines), when it has any:
 * a run that resumes from step `after` logs those steps again. */
static int drop_lines_after(const char *path, int64_t after, char *err, int errlen) {
    ust_err e;
    FILE *in = fs_fopen_regular(path, "rb", &e);
    if (!in) return errno == ENOENT ? 0 : (snprintf(err, errlen, "metrics file %s", e.msg), -1);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *out = fs_fopen_regular(tmp, "wb", &e);
    if (!out) {
        fclose(in);
        snprintf(err, errlen, "metrics file %s", e.msg);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int64_t dropped = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        int64_t st = line_step(line, n);
        if (st >= 0 && st <= after)
            fwrite(line, 1, (size_t)n, out);
        else
            dropped++;
    }
    free(line);
    fclose(in);
    int rc = fflush(out) != 0 || fsync(fileno(out)) != 0;
    rc |= fclose(out) != 0;
    if (!rc && dropped && rename(tmp, path) != 0) rc = 1;
    if (rc) snprintf(err, errlen, "metrics file %s: cannot rewrite: %s", path, strerror(errno));
    if (rc || !dropped) unlink(tmp);
    if (!rc && dropped)
        printf("metrics: dropped %lld line(s) of %s after step %lld, which this run logs again\n",
               (long long)dropped, path, (long long)after);
    return rc ? -1 : 0;
}

static int open_metrics(ust_log *l, const char *metrics_path, int64_t resume_step, char *err,
                        int errlen) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", metrics_path);
    char *slash = strrchr(dir, '/');
    ust_err e;
    if (slash && slash != dir) {
        *slash = 0;
        if (fs_mkdir_p(dir, &e)) {
            snprintf(err, errlen, "%s: %s", metrics_path, e.msg);
            return -1;
        }
    }
    if (resume_step > 0 && drop_lines_after(metrics_path, resume_step, err, errlen)) return -1;
    snprintf(l->metrics_path, sizeof l->metrics_path, "%s", metrics_path);
    if (!(l->metrics = fs_fopen_regular(metrics_path, "ab", &e))) {
        snprintf(err, errlen, "metrics file %s", e.msg);
        return -1;
    }
    return 0;
}

int log_open(ust_log *l, const char *metrics_path, const char *tb_dir, int64_t resume_step,
             char *err, int errlen) {
    bool strict = l->strict;
    *l = (ust_log){.strict = strict};
    if (metrics_path && metrics_path[0] && open_metrics(l, metrics_path, resume_step, err, errlen))
        return -1;
    if (tb_dir && tb_dir[0] && tb_open(l, tb_dir, resume_step, err, errlen)) {
        log_close(l);
        return -1;
    }
    return 0;
}

void log_close(ust_log *l) {
    if (l->metrics && fclose(l->metrics) != 0)
        write_failed(l, "metrics file", l->metrics_path, &l->warned_metrics, errno);
    if (l->tb && fclose(l->tb) != 0)
        write_failed(l, "TensorBoard event file", l->tb_path, &l->warned_tb, errno);
    l->metrics = NULL;
    l->tb = NULL;
}

double log_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *log_bytes(char *buf, int n, double b) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

void log_step_line(const log_step *s) {
    char mem[32], val[48] = "", extra[256] = "";
    if (!isnan(s->val_loss)) snprintf(val, sizeof val, " | val %.4f", s->val_loss);
    size_t n = 0;
    if (!isnan(s->pp.bubble)) /* the schedule's own accounting, and the analytic value */
        n += snprintf(extra + n, sizeof extra - n, " | bubble %.3f (analytic %.3f)", s->pp.sim,
                      s->pp.analytic);
    if (s->comm.ep_ms > 0 && n < sizeof extra)
        n += snprintf(extra + n, sizeof extra - n, " | a2a %.0f ms", s->comm.ep_ms);
    for (int k = 0; k < s->mtp.n && k < LOG_MAX_MTP && n < sizeof extra; k++)
        n += snprintf(extra + n, sizeof extra - n, k ? " %.4f" : " | mtp %.4f", s->mtp.loss[k]);
    if (s->ranks.flagged && n < sizeof extra)
        n += snprintf(extra + n, sizeof extra - n, " | straggler rank %d x%.2f", s->ranks.slowest,
                      s->ranks.slowdown);
    for (int k = 0; k < LOG_SPIKES && s->layers.n > 0 && n < sizeof extra; k++) {
        static const char *const what[LOG_SPIKES] = {"grad", "act", "logit"};
        int l = s->layers.spike_layer[k];
        char where[32] = "embeddings/head"; /* the last entry: the parameters outside layers */
        if (l < s->layers.n - 1) snprintf(where, sizeof where, "layer %d", l);
        if (l >= 0)
            n += snprintf(extra + n, sizeof extra - n, " | %s spike in %s x%.1f", what[k], where,
                          s->layers.spike_ratio[k]);
    }
    /* in 64 bits, and capped: train.steps may be far beyond what the run will reach */
    double eta_s = isfinite(s->eta_s) && s->eta_s > 0 ? s->eta_s : 0;
    long long eta = eta_s < 1e12 ? (long long)(eta_s + 0.5) : 999999999999LL;
    printf("step %5lld/%lld | loss %.4f%s | lr %.3e | norm %.3f | %.0f tok/s | mfu %.1f%% | "
           "%.0f ms | mem %s%s | eta %lldh%02lldm%02llds%s\n",
           (long long)s->step, (long long)s->steps, s->loss, val, s->lr, s->grad_norm,
           s->tokens_per_s, 100 * s->mfu, s->ms, log_bytes(mem, sizeof mem, s->mem.peak), extra,
           eta / 3600, eta / 60 % 60, eta % 60, s->skipped ? " | SKIPPED (non-finite)" : "");
    fflush(stdout);
}

/* One figure of a step: its key (the JSONL's, TensorBoard's tag), its value, and whether it is
 * a count (written exactly as an integer). */
typedef struct {
    const char *key;
    double v;
    uint64_t u;
    int count;
} log_scalar;

#define LOG_MAX_SCALARS 56

static int add_scalar(log_scalar *out, int n, const char *key, double v) {
    out[n] = (log_scalar){key, v, 0, 0};
    return n + 1;
}

static int add_count(log_scalar *out, int n, const char *key, uint64_t u) {
    out[n] = (log_scalar){key, (double)u, u, 1};
    return n + 1;
}

/* The figures of step s, in the JSONL's order (step itself and the MoE table apart). */
static int log_scalars(const log_step *s, double unix_time, log_scalar *o) {
    int n = 0;
    n = add_scalar(o, n, "loss", s->loss);
    n = add_scalar(o, n, "ce_loss", s->ce_loss);
    n = add_scalar(o, n, "lr", s->lr);
    n = add_scalar(o, n, "grad_norm", s->grad_norm);
    n = add_scalar(o, n, "tokens_per_s", s->tokens_per_s);
    n = add_scalar(o, n, "mfu", s->mfu);
    n = add_count(o, n, "peak_mem_bytes", s->mem.peak);
    n = add_count(o, n, "comm_bytes_dp", s->comm.bytes_dp);
    n = add_count(o, n, "comm_bytes_tp", s->comm.bytes_tp);
    n = add_count(o, n, "mem_params", s->mem.params);
    n = add_count(o, n, "mem_grads", s->mem.grads);
    n = add_count(o, n, "mem_optim", s->mem.optim);
    n = add_count(o, n, "mem_acts", s->mem.acts);
    n = add_scalar(o, n, "step_ms", s->ms);
    n = add_scalar(o, n, "tp_comm_ms", s->comm.tp_ms);
    n = add_scalar(o, n, "cp_wait_ms", s->comm.cp_wait_ms);
    n = add_scalar(o, n, "ep_comm_ms", s->comm.ep_ms);
    if (!isnan(s->pp.bubble)) {
        n = add_scalar(o, n, "pp_bubble", s->pp.bubble);
        n = add_scalar(o, n, "pp_bubble_analytic", s->pp.analytic);
        n = add_count(o, n, "comm_bytes_pp", s->comm.bytes_pp);
        n = add_scalar(o, n, "pp_bubble_sim", s->pp.sim);
        n = add_scalar(o, n, "pp_f_ms", s->pp.op_ms[0]);
        n = add_scalar(o, n, "pp_b_ms", s->pp.op_ms[1]);
        n = add_scalar(o, n, "pp_w_ms", s->pp.op_ms[2]);
    }
    if (s->comm.bytes_cp) n = add_count(o, n, "comm_bytes_cp", s->comm.bytes_cp);
    if (s->comm.bytes_cp_all) n = add_count(o, n, "comm_bytes_cp_group", s->comm.bytes_cp_all);
    if (s->comm.bytes_mirror) n = add_count(o, n, "comm_bytes_mirror", s->comm.bytes_mirror);
    if (s->comm.ep_logged) {
        n = add_count(o, n, "comm_bytes_ep", s->comm.bytes_ep);
        n = add_count(o, n, "comm_bytes_ep_internode", s->comm.bytes_ep_internode);
    }
    if (s->data.cp_docs)
        n = add_count(o, n, "cp_blocks_skipped", (uint64_t)s->data.cp_blocks_skipped);
    if (s->restarts) n = add_count(o, n, "restarts", (uint64_t)s->restarts);
    if (s->ranks.n) {
        n = add_count(o, n, "slowest_rank", (uint64_t)s->ranks.slowest);
        n = add_scalar(o, n, "slowest_slowdown", s->ranks.slowdown);
        if (s->ranks.flagged) n = add_count(o, n, "straggler_rank", (uint64_t)s->ranks.slowest);
    }
    if (!isnan(s->max_logit)) {
        n = add_scalar(o, n, "max_logit", s->max_logit);
        if (s->qk_clipped >= 0) n = add_count(o, n, "qk_clipped_heads", (uint64_t)s->qk_clipped);
    }
    if (!isnan(s->val_loss)) n = add_scalar(o, n, "val_loss", s->val_loss);
    static const char *const mtp[2][LOG_MAX_MTP] = {
        {"mtp_loss_1", "mtp_loss_2", "mtp_loss_3", "mtp_loss_4"},
        {"val_mtp_loss_1", "val_mtp_loss_2", "val_mtp_loss_3", "val_mtp_loss_4"}};
    for (int k = 0; k < s->mtp.n && k < LOG_MAX_MTP; k++) {
        n = add_scalar(o, n, mtp[0][k], s->mtp.loss[k]);
        if (!isnan(s->mtp.val[k])) n = add_scalar(o, n, mtp[1][k], s->mtp.val[k]);
    }
    n = add_scalar(o, n, "time", unix_time);
    n = add_scalar(o, n, "elapsed_s", s->elapsed_s);
    n = add_count(o, n, "samples_seen", (uint64_t)s->data.samples_seen);
    n = add_count(o, n, "tokens_seen", (uint64_t)s->data.tokens_seen);
    n = add_count(o, n, "target_tokens", (uint64_t)s->data.target_tokens);
    if (!isnan(s->data.pad_frac)) n = add_scalar(o, n, "padding_frac", s->data.pad_frac);
    return n;
}

/* Layer i's overload factor: its busiest expert's tokens over the mean, from the step's global
 * counts (the last forward's figures without them). */
static double moe_overload(const log_step *s, int i) {
    if (s->moe.E <= 0) return s->moe.load_max[i] / s->moe.load_mean[i];
    double mx = 0, sum = 0;
    for (int e = 0; e < s->moe.E; e++) {
        mx = s->moe.experts[i][e] > mx ? s->moe.experts[i][e] : mx;
        sum += s->moe.experts[i][e];
    }
    return sum > 0 ? mx * s->moe.E / sum : NAN;
}

/* JSON has no NaN/Infinity: non-finite numbers are written as null. "time" keeps its
 * milliseconds (%.9g would round it to seconds). */
static void json_scalar(FILE *f, const log_scalar *x) {
    if (x->count)
        fprintf(f, ",\"%s\":%llu", x->key, (unsigned long long)x->u);
    else if (!isfinite(x->v))
        fprintf(f, ",\"%s\":null", x->key);
    else
        fprintf(f, strcmp(x->key, "time") ? ",\"%s\":%.9g" : ",\"%s\":%.3f", x->key, x->v);
}

static void json_moe(FILE *f, const log_step *s) {
    fprintf(f, ",\"moe\":[");
    for (int i = 0; i < s->moe.n; i++) {
        log_scalar x[3] = {{"load_max", s->moe.load_max[i], 0, 0},
                           {"load_mean", s->moe.load_mean[i], 0, 0},
                           {"dropped", s->moe.dropped[i], 0, 0}};
        fprintf(f, "%s{\"layer\":%d", i ? "," : "", s->moe.layer[i]);
        for (int k = 0; k < 3; k++) json_scalar(f, &x[k]);
        fprintf(f, ",\"rank_rows\":[");
        for (int r = 0; r < s->moe.ep; r++)
            fprintf(f, "%s%.9g", r ? "," : "", s->moe.rank_rows[i][r]);
        fprintf(f, "],\"experts\":[");
        for (int e = 0; e < s->moe.E; e++) fprintf(f, "%s%.9g", e ? "," : "", s->moe.experts[i][e]);
        double over = moe_overload(s, i);
        fprintf(f, isfinite(over) ? "],\"overload\":%.6g" : "],\"overload\":null", over);
        double br = s->moe.bias_range[i];
        fprintf(f, isfinite(br) ? ",\"bias_range\":%.6g}" : ",\"bias_range\":null}", br);
    }
    fputc(']', f);
}

static void json_data(FILE *f, const log_step *s) {
    fprintf(f, ",\"data_samples\":[");
    for (int d = 0; d < s->data.n; d++)
        fprintf(f, "%s%lld", d ? "," : "", (long long)s->data.samples[d]);
    fputc(']', f);
}

static void json_ranks(FILE *f, const log_step *s) {
    const char *key[3] = {"rank_compute_ms", "rank_wait_ms", "rank_step_ms"};
    const double *v[3] = {s->ranks.compute_ms, s->ranks.wait_ms, s->ranks.step_ms};
    for (int k = 0; k < 3; k++) {
        fprintf(f, ",\"%s\":[", key[k]);
        for (int r = 0; r < s->ranks.n; r++) fprintf(f, "%s%.4f", r ? "," : "", v[k][r]);
        fputc(']', f);
    }
}

/* logging.stats_every: per layer, the last entry the parameters outside the layers (the
 * activations' and logits' arrays: the layers only). */
static void json_layers(FILE *f, const log_step *s) {
    const char *key[4] = {"layer_grad_norm", "layer_update_ratio", "layer_act_rms",
                          "layer_max_logit"};
    const double *v[4] = {s->layers.grad_norm, s->layers.update_ratio, s->layers.act_rms,
                          s->layers.max_logit};
    for (int k = 0; k < 3 + s->layers.has_logit; k++) {
        fprintf(f, ",\"%s\":[", key[k]);
        for (int i = 0; i < s->layers.n - (k >= 2); i++)
            fprintf(f, isfinite(v[k][i]) ? "%s%.6g" : "%snull", i ? "," : "", v[k][i]);
        fputc(']', f);
    }
    static const char *const spike[LOG_SPIKES] = {"layer_spike", "layer_act_spike",
                                                  "layer_logit_spike"};
    for (int k = 0; k < LOG_SPIKES; k++)
        if (s->layers.spike_layer[k] >= 0)
            fprintf(f, ",\"%s\":%d,\"%s_ratio\":%.4g", spike[k], s->layers.spike_layer[k], spike[k],
                    s->layers.spike_ratio[k]);
}

/* A spike's rise under its layer's tag: layers/L/grad_norm_spike, act_rms_spike,
 * max_logit_spike (the steps without one have no point). */
static void tb_spikes(pbuf *summary, const log_step *s) {
    static const char *const what[LOG_SPIKES] = {"grad_norm", "act_rms", "max_logit"};
    for (int k = 0; k < LOG_SPIKES && s->layers.n > 0; k++) {
        int l = s->layers.spike_layer[k];
        char tag[64];
        if (l < 0) continue;
        if (l < s->layers.n - 1)
            snprintf(tag, sizeof tag, "layers/%d/%s_spike", l, what[k]);
        else
            snprintf(tag, sizeof tag, "layers/other/%s_spike", what[k]);
        tb_value(summary, tag, s->layers.spike_ratio[k]);
    }
}

static void tb_layers(pbuf *summary, const log_step *s) {
    tb_spikes(summary, s);
    for (int i = 0; i < s->layers.n; i++) {
        char tag[64], who[24];
        if (i < s->layers.n - 1)
            snprintf(who, sizeof who, "%d", i);
        else
            snprintf(who, sizeof who, "other");
        snprintf(tag, sizeof tag, "layers/%s/grad_norm", who);
        if (isfinite(s->layers.grad_norm[i])) tb_value(summary, tag, s->layers.grad_norm[i]);
        snprintf(tag, sizeof tag, "layers/%s/update_ratio", who);
        if (isfinite(s->layers.update_ratio[i])) tb_value(summary, tag, s->layers.update_ratio[i]);
        if (i == s->layers.n - 1) break; /* the activations and logits are the layers' */
        snprintf(tag, sizeof tag, "layers/%s/act_rms", who);
        if (isfinite(s->layers.act_rms[i])) tb_value(summary, tag, s->layers.act_rms[i]);
        snprintf(tag, sizeof tag, "layers/%s/max_logit", who);
        if (isfinite(s->layers.max_logit[i])) tb_value(summary, tag, s->layers.max_logit[i]);
    }
}

/* eval.tasks: "tasks": {"NAME": {"items", "acc", "acc_norm", "loglik"}} (TensorBoard:
 * task/NAME/acc...). */
static const char *const TASK_KEYS[3] = {"acc", "acc_norm", "loglik"};

static double task_value(const log_step *s, int i, int k) {
    return k == 0 ? s->tasks.acc[i] : k == 1 ? s->tasks.acc_norm[i] : s->tasks.loglik[i];
}

static void json_tasks(FILE *f, const log_step *s) {
    fprintf(f, ",\"tasks\":{");
    for (int i = 0; i < s->tasks.n; i++) {
        fprintf(f, "%s\"%s\":{\"items\":%d", i ? "," : "", s->tasks.name[i], s->tasks.items[i]);
        for (int k = 0; k < 3; k++) {
            log_scalar x = {TASK_KEYS[k], task_value(s, i, k), 0, 0};
            json_scalar(f, &x);
        }
        fputc('}', f);
    }
    fputc('}', f);
}

static void tb_tasks(pbuf *summary, const log_step *s) {
    for (int i = 0; i < s->tasks.n; i++)
        for (int k = 0; k < 3; k++) {
            char tag[96];
            snprintf(tag, sizeof tag, "task/%s/%s", s->tasks.name[i], TASK_KEYS[k]);
            if (isfinite(task_value(s, i, k))) tb_value(summary, tag, task_value(s, i, k));
        }
}

/* The step's event: its wall_time is the JSONL's "time", which is no scalar here (a float32 holds
 * unix seconds only to 128 s); elapsed_s is the scalar of time. */
static void tb_step(ust_log *l, const log_step *s, const log_scalar *x, int n, double unix_time) {
    pbuf ev, summary;
    summary.n = 0;
    summary.overflow = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i].v) && strcmp(x[i].key, "time")) tb_value(&summary, x[i].key, x[i].v);
    for (int d = 0; d < s->data.n; d++) {
        char tag[48];
        snprintf(tag, sizeof tag, "data/dataset%d/samples", d);
        tb_value(&summary, tag, (double)s->data.samples[d]);
    }
    for (int r = 0; r < s->ranks.n; r++) {
        char tag[48];
        snprintf(tag, sizeof tag, "rank/%d/compute_ms", r);
        tb_value(&summary, tag, s->ranks.compute_ms[r]);
        snprintf(tag, sizeof tag, "rank/%d/wait_ms", r);
        tb_value(&summary, tag, s->ranks.wait_ms[r]);
        snprintf(tag, sizeof tag, "rank/%d/step_ms", r);
        tb_value(&summary, tag, s->ranks.step_ms[r]);
    }
    for (int i = 0; i < s->moe.n; i++) {
        const char *what[5] = {"load_max", "load_mean", "dropped", "overload", "bias_range"};
        double v[5] = {s->moe.load_max[i], s->moe.load_mean[i], s->moe.dropped[i],
                       moe_overload(s, i), s->moe.bias_range[i]};
        for (int k = 0; k < 5; k++) {
            char tag[64];
            snprintf(tag, sizeof tag, "moe/layer%d/%s", s->moe.layer[i], what[k]);
            if (isfinite(v[k])) tb_value(&summary, tag, v[k]);
        }
    }
    tb_layers(&summary, s);
    tb_tasks(&summary, s);
    tb_event_head(&ev, s->step, unix_time);
    if (summary.overflow) ev.overflow = 1;
    pb_len(&ev, 5, summary.buf, summary.n);
    tb_write(l, &ev);
}

void log_step_json(ust_log *l, const log_step *s) {
    log_scalar x[LOG_MAX_SCALARS];
    double now = unix_now_s();
    int n = log_scalars(s, now, x);
    if (l->tb) tb_step(l, s, x, n, now);
    if (!l->metrics) return;
    fprintf(l->metrics, "{\"step\":%lld", (long long)s->step);
    for (int i = 0; i < n; i++) {
        json_scalar(l->metrics, &x[i]);
        if (!strcmp(x[i].key, "ep_comm_ms") && s->moe.n > 0) json_moe(l->metrics, s);
    }
    if (s->data.n > 0) json_data(l->metrics, s);
    if (s->ranks.n > 0) json_ranks(l->metrics, s);
    if (s->layers.n > 0) json_layers(l->metrics, s);
    if (s->tasks.n > 0) json_tasks(l->metrics, s);
    if (s->skipped) fprintf(l->metrics, ",\"skipped\":true");
    if (s->spike) fprintf(l->metrics, ",\"spike\":\"%s\"", s->spike == 1 ? "skipped" : "rewound");
    fprintf(l->metrics, "}\n");
    if (flush_checked(l->metrics))
        write_failed(l, "metrics file", l->metrics_path, &l->warned_metrics, errno);
}
