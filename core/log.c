#include "log.h"

#include "fs.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

int log_open(ust_log *l, const char *metrics_path, char *err, int errlen) {
    l->metrics = NULL;
    if (!metrics_path || !metrics_path[0]) return 0;
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
    if (!(l->metrics = fs_fopen_regular(metrics_path, "ab", &e))) {
        snprintf(err, errlen, "metrics file %s", e.msg);
        return -1;
    }
    return 0;
}

void log_close(ust_log *l) {
    if (l->metrics) fclose(l->metrics);
    l->metrics = NULL;
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
    char mem[32], val[48] = "", extra[96] = "";
    if (!isnan(s->val_loss)) snprintf(val, sizeof val, " | val %.4f", s->val_loss);
    size_t n = 0;
    if (!isnan(s->pp_bubble)) /* the schedule's own accounting, and the analytic value */
        n += snprintf(extra + n, sizeof extra - n, " | bubble %.3f (analytic %.3f)",
                      s->pp_bubble_sim, s->pp_bubble_analytic);
    if (s->ep_comm_ms > 0 && n < sizeof extra)
        snprintf(extra + n, sizeof extra - n, " | a2a %.0f ms", s->ep_comm_ms);
    int eta = (int)(s->eta_s + 0.5);
    printf("step %5lld/%lld | loss %.4f%s | lr %.3e | norm %.3f | %.0f tok/s | mfu %.1f%% | "
           "%.0f ms | mem %s%s | eta %dh%02dm%02ds%s\n",
           (long long)s->step, (long long)s->steps, s->loss, val, s->lr, s->grad_norm,
           s->tokens_per_s, 100 * s->mfu, s->ms, log_bytes(mem, sizeof mem, s->peak_mem_bytes),
           extra, eta / 3600, eta / 60 % 60, eta % 60, s->skipped ? " | SKIPPED (non-finite)" : "");
    fflush(stdout);
}

/* JSON has no NaN/Infinity: non-finite numbers are written as null. */
static void json_num(FILE *f, const char *key, double v) {
    if (isfinite(v))
        fprintf(f, ",\"%s\":%.9g", key, v);
    else
        fprintf(f, ",\"%s\":null", key);
}

void log_step_json(ust_log *l, const log_step *s) {
    if (!l->metrics) return;
    fprintf(l->metrics, "{\"step\":%lld", (long long)s->step);
    json_num(l->metrics, "loss", s->loss);
    json_num(l->metrics, "lr", s->lr);
    json_num(l->metrics, "grad_norm", s->grad_norm);
    json_num(l->metrics, "tokens_per_s", s->tokens_per_s);
    json_num(l->metrics, "mfu", s->mfu);
    fprintf(l->metrics, ",\"peak_mem_bytes\":%zu", s->peak_mem_bytes);
    fprintf(l->metrics, ",\"comm_bytes_dp\":%llu,\"comm_bytes_tp\":%llu",
            (unsigned long long)s->comm_bytes_dp, (unsigned long long)s->comm_bytes_tp);
    fprintf(l->metrics, ",\"mem_params\":%zu,\"mem_grads\":%zu,\"mem_optim\":%zu,\"mem_acts\":%zu",
            s->mem_params, s->mem_grads, s->mem_optim, s->mem_acts);
    json_num(l->metrics, "step_ms", s->ms);
    json_num(l->metrics, "tp_comm_ms", s->tp_comm_ms);
    json_num(l->metrics, "cp_wait_ms", s->cp_wait_ms);
    json_num(l->metrics, "ep_comm_ms", s->ep_comm_ms);
    if (!isnan(s->pp_bubble)) {
        json_num(l->metrics, "pp_bubble", s->pp_bubble);
        json_num(l->metrics, "pp_bubble_analytic", s->pp_bubble_analytic);
        fprintf(l->metrics, ",\"comm_bytes_pp\":%llu", (unsigned long long)s->comm_bytes_pp);
        json_num(l->metrics, "pp_bubble_sim", s->pp_bubble_sim);
        json_num(l->metrics, "pp_f_ms", s->pp_op_ms[0]);
        json_num(l->metrics, "pp_b_ms", s->pp_op_ms[1]);
        json_num(l->metrics, "pp_w_ms", s->pp_op_ms[2]);
    }
    if (s->moe_n > 0) {
        fprintf(l->metrics, ",\"moe\":[");
        for (int i = 0; i < s->moe_n; i++) {
            fprintf(l->metrics, "%s{\"layer\":%d", i ? "," : "", s->moe_layer[i]);
            json_num(l->metrics, "load_max", s->moe_load_max[i]);
            json_num(l->metrics, "load_mean", s->moe_load_mean[i]);
            json_num(l->metrics, "dropped", s->moe_dropped[i]);
            fputc('}', l->metrics);
        }
        fputc(']', l->metrics);
    }
    if (!isnan(s->val_loss)) json_num(l->metrics, "val_loss", s->val_loss);
    if (s->skipped) fprintf(l->metrics, ",\"skipped\":true");
    fprintf(l->metrics, "}\n");
    fflush(l->metrics);
}
