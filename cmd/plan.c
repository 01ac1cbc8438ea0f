/* ustrain plan CONFIG --world N ...: the layouts of N GPUs that fit the model, ranked by the
 * estimated step time of core/planner, printed as the Playbook's three steps; --write puts the
 * best one into a ready config. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "cmd.h"
#include "config.h"
#include "error.h"
#include "fs.h"
#include "hf_import.h"
#include "log.h"
#include "plan.h"
#include "planner.h"
#include "pp_schedule.h"

static const char *PLAN_USAGE =
    "usage: ustrain plan CONFIG --world N [--gpu-mem SIZE] [--gpus-per-node N]\n"
    "           [--global-batch SEQS|TOKENS] [--seq-len N] [--mfu F] [--peak-flops FLOPS]\n"
    "           [--bw-intra BYTES_PER_S] [--bw-inter BYTES_PER_S] [--top N] [--all]\n"
    "           [--write OUT.yaml] [--set key.path=value ...]\n"
    "  SIZE: bytes with an optional K/M/G/T or KiB/MiB/GiB/TiB (powers of 1024) or KB/MB/GB/TB\n"
    "        (powers of 1000) suffix; default 80GiB\n"
    "  --global-batch: sequences (512), or tokens with a K/M/G suffix (4M = 4*2^20) or 'tok'\n"
    "        (4194304tok); default the config's train.global_batch_size\n"
    "  --world, --gpus-per-node, --top, --seq-len: whole numbers 1..16777216; --mfu in (0, 1];\n"
    "        --peak-flops, --bw-intra, --bw-inter: numbers > 0 (450e9)\n"
    "  defaults: --gpus-per-node 8 --mfu 0.4 --peak-flops 989e12 --bw-intra 450e9 --bw-inter 50e9\n"
    "        --top 10; the config's parallel section is ignored\n";

static int bad(const char *fmt, const char *a, const char *b) {
    return cmd_usage_error("ustrain plan", "(run `ustrain plan --help` for usage)", fmt, a, b);
}

/* --write's file, claimed before the search: a regular file or a new one, written through a
 * temporary in its directory that is created now (a FIFO, a read-only file system or a full
 * directory is exit 2 before a long search) and renamed over the path at the end (a search that
 * fails leaves an existing file as it was). */
static int check_write_target(const char *path, FILE **out, char *tmp, size_t cap) {
    struct stat st;
    ust_err why;
    if (ckpt_refuse_output(path, "--write", &why)) return bad("%s%s", why.msg, "");
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return bad("--write %s: %s, not a regular file", path, fs_kind(st.st_mode));
    const char *slash = strrchr(path, '/');
    int dn = slash ? (int)(slash - path) + (slash == path) : 1;
    if (snprintf(tmp, cap, "%.*s/.%s.plan.XXXXXX", dn, slash ? path : ".",
                 slash ? slash + 1 : path) >= (int)cap)
        return bad("--write %s: the path is too long%s", path, "");
    int fd = mkstemp(tmp);
    if (fd < 0)
        return bad("--write %s: no file can be created in its directory (%s)", path,
                   strerror(errno));
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) || !(*out = fdopen(fd, "wb"))) {
        int err = errno;
        close(fd), unlink(tmp);
        return bad("--write %s: %s", path, strerror(err));
    }
    return 0;
}

/* "512" sequences; "4M", "4Mtok", "4194304tok" tokens (K/M/G binary). Returns 0 with either
 * *seqs (at most 2^30) or *tokens (at most 2^50) set. */
static int parse_batch(const char *s, long long *seqs, long long *tokens) {
    char *end;
    if (!isdigit((unsigned char)s[0])) return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (v <= 0 || errno) return -1;
    long long m = 1;
    int tok = 0;
    if (*end == 'K' || *end == 'M' || *end == 'G') {
        m = 1LL << (*end == 'K' ? 10 : *end == 'M' ? 20 : 30);
        tok = 1, end++;
    }
    if (strcmp(end, "tok") == 0 || strcmp(end, "tokens") == 0)
        tok = 1;
    else if (*end)
        return -1;
    if (v > (tok ? (1LL << 50) : (1LL << 30)) / m) return -1;
    *seqs = *tokens = 0;
    *(tok ? tokens : seqs) = v * m;
    return 0;
}

typedef struct {
    const char *config, *write;
    FILE *out;      /* --write's temporary (check_write_target), renamed over it at the end */
    char tmp[4200]; /* that temporary's path */
    int world, top, all, seq_len;
    long long batch_seqs, batch_tokens;
    planner_hw hw;
} plan_opts;

/* Parses argv into o; --set assignments are applied later (they need the loaded config). */
static int parse_args(int argc, char **argv, plan_opts *o) {
    const cmd_who who = {"ustrain plan", "(run `ustrain plan --help` for usage)"};
    memset(o, 0, sizeof *o);
    planner_hw_defaults(&o->hw);
    o->top = 10;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (strcmp(a, "--all") == 0) {
            o->all = 1;
            continue;
        }
        if (a[0] != '-') {
            if (o->config) return bad("unexpected argument %s%s", a, "");
            o->config = a;
            continue;
        }
        static const char *const with_value[] = {
            "--world",    "--gpu-mem", "--gpus-per-node", "--global-batch",
            "--seq-len",  "--mfu",     "--peak-flops",    "--bw-intra",
            "--bw-inter", "--top",     "--write",         "--set",
            NULL};
        int known = 0;
        for (int k = 0; with_value[k]; k++) known |= strcmp(a, with_value[k]) == 0;
        if (!known)
            return bad("unknown option %s%s", a,
                       " (allowed: --world --gpu-mem --gpus-per-node --global-batch --seq-len "
                       "--mfu --peak-flops --bw-intra --bw-inter --top --all --write --set)");
        if (!v) return bad("%s needs a value%s", a, "");
        i++;
        if (strcmp(a, "--set") == 0 && cmd_set_arg(&who, argc, argv, i)) return UST_EXIT_USAGE;
        if (strcmp(a, "--world") == 0 || strcmp(a, "--gpus-per-node") == 0 ||
            strcmp(a, "--top") == 0 || strcmp(a, "--seq-len") == 0) {
            if (cmd_int_opt(&who, a, v, 1, 1 << 24, &n)) return UST_EXIT_USAGE;
            *(strcmp(a, "--world") == 0           ? &o->world
              : strcmp(a, "--gpus-per-node") == 0 ? &o->hw.gpus_per_node
              : strcmp(a, "--top") == 0           ? &o->top
                                                  : &o->seq_len) = (int)n;
        } else if (strcmp(a, "--gpu-mem") == 0) {
            if (cmd_size_opt(&who, a, v, 1, 0x1p60, &o->hw.gpu_mem)) return UST_EXIT_USAGE;
        } else if (strcmp(a, "--global-batch") == 0) {
            if (parse_batch(v, &o->batch_seqs, &o->batch_tokens))
                return bad("--global-batch %s: expected sequences (512, at most 2^30) or tokens "
                           "(4M, 4194304tok, at most 2^50)%s",
                           v, "");
        } else if (strcmp(a, "--mfu") == 0) {
            if (cmd_num_opt(&who, a, v, 0, 1, CMD_LO_OPEN, &o->hw.mfu)) return UST_EXIT_USAGE;
        } else if (strcmp(a, "--peak-flops") == 0 || strcmp(a, "--bw-intra") == 0 ||
                   strcmp(a, "--bw-inter") == 0) {
            double *dst = strcmp(a, "--peak-flops") == 0 ? &o->hw.peak_flops
                          : strcmp(a, "--bw-intra") == 0 ? &o->hw.bw_intra
                                                         : &o->hw.bw_inter;
            if (cmd_num_opt(&who, a, v, 0, INFINITY, CMD_LO_OPEN, dst)) return UST_EXIT_USAGE;
        } else if (strcmp(a, "--write") == 0) {
            o->write = v;
        }
    }
    if (!o->config) return bad("missing CONFIG (a YAML file)%s%s", "", "");
    if (!o->world) return bad("missing --world N (the number of GPUs)%s%s", "", "");
    return o->write ? check_write_target(o->write, &o->out, o->tmp, sizeof o->tmp) : 0;
}

/* Loads the config, applies --set, --seq-len and --global-batch, and checks the model alone
 * (with a one-rank layout; the search fills the layout in). */
static int load_base(int argc, char **argv, const plan_opts *o, ust_config *c) {
    ust_err e;
    char buf[64];
    cfg_defaults(c);
    if (cfg_load_file(c, o->config, &e)) goto fail;
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], "--set") == 0 && cfg_set(c, argv[++i], &e)) goto fail;
    if (hf_resolve_config(c, &e)) goto fail;
    if (o->seq_len) c->train.seq_len = o->seq_len;
    if (o->batch_tokens) {
        if (o->batch_tokens % c->train.seq_len) {
            snprintf(buf, sizeof buf, "%lld tokens", o->batch_tokens);
            fprintf(stderr,
                    "ustrain plan: error: --global-batch %s is not a whole number of %d-token "
                    "sequences\n",
                    buf, c->train.seq_len);
            return UST_EXIT_USAGE;
        }
        if (o->batch_tokens / c->train.seq_len > 1 << 30)
            return bad("--global-batch: too many sequences%s%s", "", "");
        c->train.global_batch_size = (int)(o->batch_tokens / c->train.seq_len);
    } else if (o->batch_seqs) {
        if (o->batch_seqs > 1 << 30) return bad("--global-batch: too many sequences%s%s", "", "");
        c->train.global_batch_size = (int)o->batch_seqs;
    }
    ust_config one = *c;
    planner_layout l = {1, 1, 1, 1, 1, 1, 0, 1, false, RECOMPUTE_NONE, PP_1F1B};
    planner_apply(c, &l, &one);
    one.train.global_batch_size = 1;
    if (cfg_validate(&one, 1, &e)) goto fail;
    return 0;
fail:
    fprintf(stderr, "ustrain plan: error: %s\n", e.msg);
    return UST_EXIT_USAGE;
}

/* seconds with three significant-ish digits in s, ms or us, so tiny models read too */
static const char *fmt_time(char *buf, size_t n, double s) {
    if (s == 0 || s >= 1)
        snprintf(buf, n, "%.4g s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.4g ms", s * 1e3);
    else
        snprintf(buf, n, "%.4g us", s * 1e6);
    return buf;
}

/* a count as 8.03 B, 213.6 M, 12.5 K */
static const char *fmt_count(char *buf, size_t n, double x) {
    if (x >= 1e9)
        snprintf(buf, n, "%.3g B", x / 1e9);
    else if (x >= 1e6)
        snprintf(buf, n, "%.4g M", x / 1e6);
    else
        snprintf(buf, n, "%.4g K", x / 1e3);
    return buf;
}

static const char *recompute_name(ust_recompute r) {
    return r == RECOMPUTE_FULL ? "full" : r == RECOMPUTE_SELECTIVE ? "selective" : "none";
}

static void layout_line(const planner_layout *l, int world, char *buf, size_t n) {
    snprintf(buf, n,
             "dp=%d tp=%d pp=%d vpp=%d pp_schedule=%s cp=%d ep=%d sp=%s zero=%d micro_batch=%d "
             "recompute=%s (world %d)",
             l->dp, l->tp, l->pp, l->vpp, pps_kind_name(l->schedule), l->cp, l->ep,
             l->sp ? "on" : "off", l->zero, l->micro_batch, recompute_name(l->recompute), world);
}

static void print_steps(const ust_config *c, const plan_opts *o, const planner_stats *st,
                        const planner_entry *best) {
    char line[256];
    layout_line(&best->l, o->world, line, sizeof line);
    planner_sizes s;
    planner_model_sizes(c, &s);
    char b[4][32], n[2][32];
    double active =
        s.n_params -
        (s.n_moe ? s.n_moe * (c->model.moe.num_experts - c->model.moe.top_k) * s.expert : 0);
    printf("ustrain plan: %s on %d GPUs (%d per node, %s each); compute at MFU %.2f of %.0f "
           "TFLOP/s; bandwidth %.0f GB/s intra-node, %.0f GB/s inter-node\n",
           c->source, o->world, o->hw.gpus_per_node, log_bytes(b[0], 32, o->hw.gpu_mem), o->hw.mfu,
           o->hw.peak_flops / 1e12, o->hw.bw_intra / 1e9, o->hw.bw_inter / 1e9);
    printf("model: %s, %s parameters (%s active per token), %d layers, d_model %d; %.4g "
           "GFLOP per token (6 x active matmul weights + attention over each layer's keys)\n",
           c->model.arch == ARCH_GPT2 ? "gpt2" : "llama", fmt_count(b[3], 32, s.n_params),
           fmt_count(n[0], 32, active), c->model.n_layer, c->model.d_model,
           planner_flops_per_token(c) / 1e9);
    /* fp32 weights and gradients, and the two optimizer slots (AdamW's moments; Muon's momentum
     * and the slot its matrices carry unused) in fp32 or bf16 (optimizer.state_dtype) */
    int per = 8 + 2 * (c->optimizer.state_dtype ? 2 : 4);
    printf("step 1, fit one model instance: weights, gradients and optimizer state take %d bytes "
           "x %s = %s unsharded (fp32%s); %ld of %ld valid layouts fit %s per rank; the "
           "smallest model-parallel degree that fits is tp x pp x cp = %d (%s)\n",
           per, fmt_count(n[1], 32, s.n_params), log_bytes(b[1], 32, (double)per * s.n_params),
           c->optimizer.state_dtype ? ", bf16 optimizer state" : "", st->fitting,
           st->fitting + st->over_mem, log_bytes(b[2], 32, o->hw.gpu_mem),
           best->l.tp * best->l.pp * best->l.cp, line);
    printf("step 2, reach the global batch: %d sequences x %d tokens = %lld tokens per step = "
           "dp x micro-batch x gradient accumulation\n",
           c->train.global_batch_size, c->train.seq_len,
           (long long)c->train.global_batch_size * c->train.seq_len);
    printf("step 3, maximize throughput: ranked by estimated step time = compute + communication "
           "(no overlap) + pipeline bubble\n");
}

static void print_table(const ust_config *c, const planner_entry *e, long n, int top) {
    printf("\n  #   dp  tp  pp vpp schedule     cp  ep sp zero  mbs   ga recompute        step"
           "     compute        comm      bubble   mem/rank        tok/s\n");
    for (long i = 0; i < n && i < top; i++) {
        const planner_layout *l = &e[i].l;
        const planner_cost *k = &e[i].cost;
        char m[32], t[4][32];
        printf("%3ld %4d %3d %3d %3d %-11s %3d %3d %2s %4d %4d %4d %-9s %11s %11s %11s %11s %10s "
               "%12.0f\n",
               i + 1, l->dp, l->tp, l->pp, l->vpp, pps_kind_name(l->schedule), l->cp, l->ep,
               l->sp ? "y" : "n", l->zero, l->micro_batch,
               c->train.global_batch_size / (l->dp * l->micro_batch), recompute_name(l->recompute),
               fmt_time(t[0], 32, k->total), fmt_time(t[1], 32, k->compute),
               fmt_time(t[2], 32, k->comm), fmt_time(t[3], 32, k->bubble),
               log_bytes(m, sizeof m, k->mem_peak), k->tokens_per_s);
    }
}

/* One layout's time per group and the bytes a rank sends over it per step. */
static void print_groups(const planner_entry *e) {
    char t[32], m[32];
    const planner_layout *l = &e->l;
    int size[PLAN_NGROUPS] = {[PLAN_DP] = l->dp * l->cp,
                              [PLAN_TP] = l->tp,
                              [PLAN_CP] = l->cp,
                              [PLAN_PP] = l->pp,
                              [PLAN_EP] = l->ep};
    printf("  communication per step:");
    for (int g = 0; g < PLAN_NGROUPS; g++) {
        if (size[g] > 1) {
            printf(" %s %s (%d ranks, %s, %s sent", planner_group_names[g],
                   fmt_time(t, 32, e->cost.group[g]), size[g],
                   e->cost.intra[g] ? "intra-node" : "inter-node",
                   log_bytes(m, sizeof m, e->cost.sent[g]));
            /* the ring's ranks send unequally: its busiest, and the whole group's */
            if (g == PLAN_CP)
                printf(" by the busiest rank, %s = %.0f bytes by the group",
                       log_bytes(m, sizeof m, e->cost.cp_group), e->cost.cp_group);
            if (g == PLAN_EP && !e->cost.intra[g])
                printf(", %s of them across nodes", log_bytes(m, sizeof m, e->cost.ep_inter));
            printf(")");
        } else {
            printf(" %s -", planner_group_names[g]);
        }
        printf("%s", g + 1 < PLAN_NGROUPS ? "," : "\n");
    }
}

static void print_best(const ust_config *c, const planner_entry *e, int world) {
    char line[256], m[32];
    layout_line(&e->l, world, line, sizeof line);
    printf("\nbest: %s\n", line);
    char t[4][32];
    printf("  step %s = compute %s + communication %s + bubble %s; %.0f tokens/s\n",
           fmt_time(t[0], 32, e->cost.total), fmt_time(t[1], 32, e->cost.compute),
           fmt_time(t[2], 32, e->cost.comm), fmt_time(t[3], 32, e->cost.bubble),
           e->cost.tokens_per_s);
    print_groups(e);
    printf("  memory per rank: %s (%.0f bytes; the fp32 memory plan `ustrain validate` prints)\n",
           log_bytes(m, sizeof m, e->cost.mem), e->cost.mem);
    if (e->l.pp > 1) {
        char pk[32];
        printf("  busiest pipeline rank: %s (what must fit --gpu-mem)\n",
               log_bytes(pk, sizeof pk, e->cost.mem_peak));
    }
    (void)c;
}

/* Where the config's own parallel section (if valid at this world) ranks among the fitting
 * layouts: 0-based rank (n when it does not fit), or -1 when it is not a layout of this world.
 * The description goes to buf. */
static int own_layout(const ust_config *base, const plan_opts *o, const planner_entry *e, long n,
                      char *buf, size_t len, planner_entry *mine) {
    ust_err err;
    if (cfg_validate(base, o->world, &err)) return -1;
    const __typeof__(base->parallel) *p = &base->parallel;
    /* at pp 1 the executor runs 1f1b whatever pp_schedule says (pp_kind) */
    planner_entry me = {.l = {p->dp, p->tp, p->pp, p->vpp, p->cp, p->ep, base->optimizer.zero_stage,
                              base->train.micro_batch_size, p->sp, base->train.recompute,
                              p->pp > 1 ? p->pp_schedule : PP_1F1B}};
    planner_estimate(base, &o->hw, &me.cost);
    *mine = me;
    char line[256], t[32], m[32];
    layout_line(&me.l, o->world, line, sizeof line);
    long r = 0;
    while (r < n && planner_compare(&e[r], &me) < 0) r++;
    int fits = me.cost.mem_peak <= o->hw.gpu_mem;
    snprintf(buf, len, "%s: step %s, %s per rank; %s", line, fmt_time(t, sizeof t, me.cost.total),
             log_bytes(m, sizeof m, me.cost.mem_peak), fits ? "" : "does not fit --gpu-mem");
    if (fits) {
        size_t k = strlen(buf);
        snprintf(buf + k, len - k, "would rank %ld of the %ld fitting layouts", r + 1, n);
    }
    return fits ? (int)r : (int)n;
}

static int write_yaml(const ust_config *base, const planner_entry *e, int world, plan_opts *o) {
    ust_config c;
    planner_apply(base, &e->l, &c);
    char line[256];
    layout_line(&e->l, world, line, sizeof line);
    FILE *f = o->out;
    fprintf(f,
            "# written by ustrain plan: %s\n# estimated step %.6g s (compute %.6g, comm %.6g, "
            "bubble %.6g), %.0f tokens/s; memory per rank %.0f bytes\n",
            line, e->cost.total, e->cost.compute, e->cost.comm, e->cost.bubble,
            e->cost.tokens_per_s, e->cost.mem);
    cfg_dump(&c, f);
    int failed = fflush(f) || ferror(f) || fsync(fileno(f));
    int err = errno;
    o->out = NULL;
    if (fclose(f) || failed || rename(o->tmp, o->write)) {
        fprintf(stderr, "ustrain plan: error: cannot write %s: %s\n", o->write,
                strerror(failed ? err : errno));
        unlink(o->tmp);
        return UST_EXIT_RUNTIME;
    }
    printf("wrote %s (check it with: ustrain validate %s --world %d)\n", o->write, o->write, world);
    return 0;
}

/* The three steps after the options are parsed (and --write's temporary claimed). */
static int plan_run(int argc, char **argv, plan_opts *o) {
    ust_config base;
    int rc = load_base(argc, argv, o, &base);
    if (rc) return rc;
    planner_entry *e = NULL;
    planner_stats st;
    long n = planner_search(&base, o->world, &o->hw, &e, &st);
    char line[256], b[2][32];
    if (st.candidates == st.invalid) {
        fprintf(stderr,
                "ustrain plan: error: no valid layout of --world %d for %s (%ld tried; the first "
                "refused: %s)\n",
                o->world, o->config, st.candidates, st.first_error);
        free(e);
        return UST_EXIT_USAGE;
    }
    if (n == 0) {
        layout_line(&st.smallest.l, o->world, line, sizeof line);
        fprintf(stderr,
                "ustrain plan: error: none of the %ld valid layouts fits --gpu-mem %s per rank; "
                "the smallest needs %s (%s)\n",
                st.over_mem, log_bytes(b[0], 32, o->hw.gpu_mem),
                log_bytes(b[1], 32, st.smallest.cost.mem_peak), line);
        free(e);
        return UST_EXIT_USAGE;
    }
    /* step 1's smallest model-parallel degree, before the list is cut to one entry per mesh */
    planner_entry small = e[0];
    for (long i = 1; i < n; i++)
        if (e[i].l.tp * e[i].l.pp * e[i].l.cp < small.l.tp * small.l.pp * small.l.cp) small = e[i];
    print_steps(&base, o, &st, &small);
    char own[512];
    planner_entry mine;
    int own_rank = own_layout(&base, o, e, n, own, sizeof own, &mine);
    long shown = o->all ? n : planner_best_per_mesh(e, n);
    print_table(&base, e, shown, o->top);
    printf("(%ld of %ld %s; %ld layouts tried, %ld refused by validation, %ld over memory)\n",
           shown < o->top ? shown : (long)o->top, shown,
           o->all ? "fitting layouts" : "meshes, the best variant of each (--all: every variant)",
           st.candidates, st.invalid, st.over_mem);
    print_best(&base, &e[0], o->world);
    if (own_rank >= 0) {
        printf("the config's own layout: %s\n", own);
        print_groups(&mine);
    }
    rc = o->write ? write_yaml(&base, &e[0], o->world, o) : 0;
    free(e);
    return rc;
}

int cmd_plan(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(PLAN_USAGE);
    plan_opts o;
    int rc = parse_args(argc, argv, &o);
    if (!rc) rc = plan_run(argc, argv, &o);
    if (o.out) { /* a search that failed: the temporary goes, an existing file stays */
        fclose(o.out);
        unlink(o.tmp);
    }
    return rc;
}
