/* ckpt_read: finding the newest finished checkpoint, verifying it, reading its slices and
 * state.json, and what the tools (export, generate) read of a finished step. */
#include "ckpt_internal.h"
#include "ckpt_manifest.h"
#include "fs.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_MAX (64 << 20)

/* ---------------------------------------------------------------------------------------------
 * Finding the newest checkpoint */

/* A step_N that is there but damaged: a warning naming it and what is wrong; 0 (skipped). */
__attribute__((format(printf, 2, 3))) static int damaged(const char *step_dir, const char *fmt,
                                                         ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "ustrain: warning: checkpoint %s %s (a published step is never unfinished: it is "
            "damaged); it is not resumed from\n",
            step_dir, what);
    return 0;
}

/* 1: dir/name is a finished step (its state.json is a regular file and its manifest valid); 0:
 * gone (pruned), or damaged: not a directory, no state.json, no valid manifest (a directory older
 * ustrains wrote, one left by hand): skipped with a warning naming it, as a step_N is only ever
 * published whole (temporaries are .tmp_step_N.<job>); -1: its state.json is something else (a
 * FIFO, a directory): refused, never silently skipped or waited for. */
static int is_finished(const char *dir, const char *name, ust_err *e) {
    char p[PATH_MAX], step_dir[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s/%s", dir, name, STATE_JSON) >= (int)sizeof p) return 0;
    snprintf(step_dir, sizeof step_dir, "%s/%s", dir, name);
    if (stat(step_dir, &st) != 0) return 0; /* gone: pruned meanwhile */
    if (!S_ISDIR(st.st_mode))
        return damaged(step_dir, "is %s, not a directory", fs_kind(st.st_mode));
    if (stat(p, &st) != 0)
        return damaged(step_dir, "has no usable %s (%s)", STATE_JSON, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ust_errf(e, "checkpoint %s/%s: %s is %s, not a regular file", dir, name, STATE_JSON,
                        fs_kind(st.st_mode));
    ust_err why;
    int valid = ckman_valid(step_dir, ckpt_parse_step_name(name), &why);
    if (valid == 0)
        fprintf(stderr,
                "ustrain: warning: checkpoint %s has no %s (not sealed: written by an older "
                "ustrain, or not by ustrain); it is not resumed from\n",
                step_dir, CKMAN_FILE);
    if (valid < 0) fprintf(stderr, "ustrain: warning: %s; it is not resumed from\n", why.msg);
    return valid > 0;
}

/* The highest finished step_N below `below`, other than step `skip` (looked into already);
 * .tmp_step_N and .old_step_N never count. */
static int newest_below(const char *dir, int64_t below, int64_t skip, char *name, size_t n,
                        ust_err *e) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return ust_errf(e, "checkpoint: cannot read directory %s: %s", dir, strerror(errno));
    }
    int64_t *steps = NULL;
    int ns = 0, cap = 0, rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        int64_t s = ckpt_parse_step_name(de->d_name);
        if (s < 0 || s >= below || s == skip) continue;
        if (ns == cap) {
            int64_t *nn = realloc(steps, sizeof(int64_t) * (size_t)(cap = cap ? 2 * cap : 16));
            if (!nn)
                rc = ust_errf(e, "checkpoint: out of memory");
            else
                steps = nn;
        }
        if (rc == 0) steps[ns++] = s;
    }
    closedir(d);
    int64_t best = -1;
    while (rc == 0 && ns > 0) { /* newest first: only those are looked into */
        int k = 0;
        for (int i = 1; i < ns; i++)
            if (steps[i] > steps[k]) k = i;
        char nm[64];
        snprintf(nm, sizeof nm, "step_%lld", (long long)steps[k]);
        int done = is_finished(dir, nm, e);
        if (done < 0) rc = -1;
        if (done > 0) {
            best = steps[k];
            break;
        }
        steps[k] = steps[--ns];
    }
    free(steps);
    if (rc) return -1;
    if (best < 0) return 0;
    snprintf(name, n, "step_%lld", (long long)best);
    return 1;
}

static int step_path(char *out, int out_size, const char *dir, const char *name, ust_err *e) {
    int k = snprintf(out, (size_t)out_size, "%s/%s", dir, name);
    if (k < 0 || k >= out_size)
        return ust_errf(e, "checkpoint: path %s/%s does not fit %d bytes", dir, name, out_size);
    return 1;
}

int ckpt_find_latest(const char *dir, char *out, int out_size, ust_err *e) {
    char p[PATH_MAX];
    int have = ckpt_pathf(p, sizeof p, e, "%s/latest", dir) ? -1 : ckpt_check_latest(dir, e);
    if (have < 0) return -1;
    char name[64] = "";
    int64_t named = -1;
    ust_err inner;
    FILE *f = have ? fs_fopen_regular(p, "rb", &inner) : NULL;
    if (have && !f) return ust_errf(e, "checkpoint: %s", inner.msg);
    if (f) {
        if (!fgets(name, sizeof name, f)) name[0] = 0;
        fclose(f);
        name[strcspn(name, "\r\n")] = 0;
        named = ckpt_parse_step_name(name);
        int done = named < 0 ? 0 : is_finished(dir, name, e);
        if (done < 0) return -1;
        if (!done) name[0] = 0;
    }
    /* no usable `latest` (missing, or it names a step that is gone): the highest finished one */
    if (!name[0]) {
        int found = newest_below(dir, INT64_MAX, named, name, sizeof name, e);
        if (found <= 0) return found;
    }
    return step_path(out, out_size, dir, name, e);
}

int ckpt_find_latest_before(const char *dir, int64_t below, char *out, int out_size, ust_err *e) {
    char name[64];
    int found = newest_below(dir, below, -1, name, sizeof name, e);
    return found <= 0 ? found : step_path(out, out_size, dir, name, e);
}

int ckpt_verify(const char *step_dir, int rank, int world, ckpt_sync_fn sync, void *sync_arg,
                ust_err *e) {
    int rc = ckman_verify(step_dir, rank, world > 0 ? world : 1, e);
    if (!sync) return rc;
    char why[sizeof e->msg];
    snprintf(why, sizeof why, "%s", rc ? e->msg : "");
    int failed = sync(sync_arg, rc != 0, why, sizeof why);
    if (failed < 0) return 0;
    ust_errf(e, "%s", why[0] ? why : "checkpoint verification failed on another rank");
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Checkpoint reader */

#define READER_MAX_FILES 8

struct ckpt_reader {
    char dir[PATH_MAX];
    char *state;
    struct {
        char name[CKPT_NAME_MAX];
        st_file *f;
    } files[READER_MAX_FILES];
    int nfiles;
};

ckpt_reader *ckpt_open(const char *step_dir, ust_err *e) {
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) {
        ust_errf(e, "checkpoint: out of memory");
        return NULL;
    }
    char p[PATH_MAX];
    struct stat st;
    int rc = ckpt_pathf(r->dir, sizeof r->dir, e, "%s", step_dir);
    if (!rc) rc = ckpt_pathf(p, sizeof p, e, "%s/%s", step_dir, STATE_JSON);
    if (!rc && stat(step_dir, &st) != 0)
        rc = ust_errf(e, "checkpoint %s: %s", step_dir, strerror(errno));
    else if (!rc && !S_ISDIR(st.st_mode))
        rc = ust_errf(e, "checkpoint %s: not a directory", step_dir);
    FILE *f = NULL;
    ust_err inner;
    if (!rc && !(f = fs_fopen_regular(p, "rb", &inner)))
        rc = ust_errf(e, "checkpoint %s: cannot read %s (not a finished checkpoint?): %s", step_dir,
                      STATE_JSON, inner.msg);
    struct stat fst;
    if (!rc && (fstat(fileno(f), &fst) != 0 || fst.st_size > STATE_MAX))
        rc = ust_errf(e, "checkpoint %s: %s is unreadable or larger than %d bytes", step_dir,
                      STATE_JSON, STATE_MAX);
    if (!rc && !(r->state = malloc((size_t)fst.st_size + 1)))
        rc = ust_errf(e, "checkpoint: out of memory");
    if (!rc) {
        size_t n = fread(r->state, 1, (size_t)fst.st_size, f);
        if (ferror(f) || n != (size_t)fst.st_size)
            rc = ust_errf(e, "checkpoint %s: cannot read %s", step_dir, STATE_JSON);
        else
            r->state[n] = 0;
    }
    if (f) fclose(f);
    if (rc) {
        ckpt_close(r);
        return NULL;
    }
    return r;
}

void ckpt_close(ckpt_reader *r) {
    if (!r) return;
    for (int i = 0; i < r->nfiles; i++) st_close(r->files[i].f);
    free(r->state);
    free(r);
}

int ckpt_parse_state(const char *json, const char *dir, ckpt_state *out, ust_err *e) {
    cJSON *j = cJSON_Parse(json ? json : "");
    const cJSON *since = cJSON_GetObjectItem(j, "batch_since");
    int64_t g = 0, s0 = 0, i0 = 0;
    /* integers within 2^53 (doubles hold them exactly) */
    int ok = j && ckpt_json_uint(cJSON_GetObjectItem(j, "step"), &out->step) &&
             ckpt_json_uint(cJSON_GetObjectItem(j, "sample_index"), &out->sample_index);
    int has_since = ok && since;
    if (has_since)
        ok = ckpt_json_uint(cJSON_GetObjectItem(since, "global_batch_size"), &g) && g > 0 &&
             ckpt_json_uint(cJSON_GetObjectItem(since, "step"), &s0) &&
             ckpt_json_uint(cJSON_GetObjectItem(since, "sample_index"), &i0);
    cJSON *loss = cJSON_GetObjectItem(j, "loss");
    out->loss = cJSON_IsNumber(loss) ? loss->valuedouble : NAN;
    char *seen_step = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "step")) : NULL;
    char *seen_si = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "sample_index")) : NULL;
    cJSON_Delete(j);
    if (!ok)
        ust_errf(e,
                 "%s/state.json: missing or invalid step / sample_index (step %.40s, sample_index "
                 "%.40s; both must be integers in [0, 2^53))",
                 dir, seen_step ? seen_step : "absent", seen_si ? seen_si : "absent");
    free(seen_step);
    free(seen_si);
    if (!ok) return -1;
    int64_t named = ckpt_dir_step(dir);
    if (named >= 0 && named != out->step)
        return ust_errf(e, "%s/state.json: says step %lld, but the directory is step %lld", dir,
                        (long long)out->step, (long long)named);
    out->batch_since_step = s0;
    out->batch_since_sample = i0;
    out->batch_size = has_since ? g : 0;
    if (has_since &&
        (s0 > out->step || i0 > out->sample_index ||
         (out->sample_index - i0) / g != out->step - s0 || (out->sample_index - i0) % g != 0))
        return ust_errf(e,
                        "%s/state.json: sample_index %lld is not what step %lld implies (%lld + "
                        "(%lld - %lld) x global_batch_size %lld)",
                        dir, (long long)out->sample_index, (long long)out->step, (long long)i0,
                        (long long)out->step, (long long)s0, (long long)g);
    return 0;
}

const char *ckpt_state_json(const ckpt_reader *r) { return r->state; }

/* The files are mapped on first use: a reader that only wants the model never maps the
 * optimizer state. */
static st_file *reader_file(ckpt_reader *r, const char *file, ust_err *e) {
    for (int i = 0; i < r->nfiles; i++)
        if (!strcmp(r->files[i].name, file)) return r->files[i].f;
    if (r->nfiles == READER_MAX_FILES || strlen(file) >= CKPT_NAME_MAX || strchr(file, '/')) {
        ust_errf(e, "checkpoint %s: cannot open file '%s'", r->dir, file);
        return NULL;
    }
    char p[PATH_MAX];
    if (ckpt_pathf(p, sizeof p, e, "%s/%s", r->dir, file)) return NULL;
    ust_err inner;
    st_file *f = st_open(p, &inner);
    if (!f) {
        ust_errf(e, "checkpoint %s: %s", r->dir, inner.msg);
        return NULL;
    }
    if (st_check_step(f, r->state, r->dir, file, e)) {
        st_close(f);
        return NULL;
    }
    snprintf(r->files[r->nfiles].name, CKPT_NAME_MAX, "%s", file);
    r->files[r->nfiles++].f = f;
    return f;
}

void ckpt_format_shape(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < n) snprintf(out + k, n - k, "]");
}

typedef struct {
    const unsigned char *src;
    float *dst;
} read_ctx;

static int read_run(void *vc, int64_t file_elem, int64_t slice_elem, int64_t n, ust_err *e) {
    (void)e;
    read_ctx *c = vc;
    memcpy(c->dst + slice_elem, c->src + 4 * file_elem, (size_t)n * 4); /* any alignment */
    return 0;
}

int ckpt_check_unused(ckpt_reader *r, const char *file, const ckpt_tensor *want, int n,
                      ust_err *e) {
    st_file *f = reader_file(r, file, e);
    if (!f) return -1;
    char *used = calloc((size_t)f->n + 1, 1);
    UST_ASSERT(used, "out of host memory");
    for (int i = 0; i < n; i++) {
        const st_entry *en = st_find(f, want[i].name);
        if (en) used[en - f->e] = 1;
    }
    int extra = 0;
    char names[512] = "";
    for (int i = 0; i < f->n; i++) {
        if (used[i]) continue;
        size_t k = strlen(names);
        if (extra++ < 3)
            snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", f->e[i].name);
    }
    free(used);
    if (!extra) return 0;
    return ust_errf(e,
                    "checkpoint %s: %s holds %d tensor%s the configured model does not have "
                    "(%s%s): the model.* keys differ from those it was trained with (its "
                    "state.json has them); resume with them, or start over with "
                    "checkpoint.resume: none",
                    r->dir, file, extra, extra == 1 ? "" : "s", names, extra > 3 ? ", ..." : "");
}

int ckpt_read_slice(ckpt_reader *r, const char *file, const ckpt_tensor *expect,
                    const ckpt_slice *s, float *host_out, ust_err *e) {
    st_file *f = reader_file(r, file, e);
    if (!f) return -1;
    const st_entry *en = st_find(f, expect->name);
    if (!en)
        return ust_errf(e, "checkpoint %s: tensor '%s' missing from %s", r->dir, expect->name,
                        file);
    bool same = en->ndim == expect->ndim;
    for (int d = 0; same && d < en->ndim; d++) same = en->shape[d] == expect->shape[d];
    if (!same) {
        char have[256], want[256];
        ckpt_format_shape(have, sizeof have, en->ndim, en->shape);
        ckpt_format_shape(want, sizeof want, expect->ndim, expect->shape);
        return ust_errf(e, "checkpoint %s: tensor '%s' has shape %s but the model expects %s",
                        r->dir, expect->name, have, want);
    }
    if (strcmp(en->dtype, "F32"))
        return ust_errf(e, "checkpoint %s: tensor '%s' in %s has dtype %s, expected F32", r->dir,
                        expect->name, file, en->dtype);
    int64_t rows = expect->ndim == 2 ? expect->shape[0] : 1;
    int64_t cols = expect->ndim == 2 ? expect->shape[1] : expect->shape[0];
    if (ckpt_check_slice(s, rows, cols, expect->name, e)) return -1;
    read_ctx c = {f->data + en->begin, host_out};
    return ckpt_for_each_run(s, cols, read_run, &c, e);
}

/* ---------------------------------------------------------------------------------------------
 * What the tools (export, generate) read of a finished checkpoint */

int ckpt_resolve_step(const char *path, const char *who, char *out, int n, ust_err *e) {
    char p[PATH_MAX];
    struct stat st;
    if (stat(path, &st) != 0)
        return ust_errf(e, "%s: checkpoint %s: %s", who, path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ust_errf(e,
                        "%s: %s is not a checkpoint directory (expected a step directory "
                        "holding state.json and model.safetensors)",
                        who, path);
    snprintf(p, sizeof p, "%s/state.json", path);
    if (access(p, F_OK) == 0) { /* a step named by the user: it verifies, or nothing is read */
        snprintf(out, (size_t)n, "%s", path);
        ust_err why;
        if (ckpt_verify(out, 0, 1, NULL, NULL, &why) == 0) return 0;
        return ust_errf(e, "%s: %s", who, why.msg);
    }
    int found = ckpt_find_latest(path, out, n, e);
    if (found < 0) return -1;
    if (!found)
        return ust_errf(e,
                        "%s: %s is not a checkpoint: no state.json there, and no finished "
                        "step_N inside it",
                        who, path);
    /* the newest that verifies, as a resume takes it */
    ust_err why;
    while (found == 1 && ckpt_verify(out, 0, 1, NULL, NULL, &why) != 0) {
        fprintf(stderr, "ustrain: warning: %s: %s; reading the previous complete checkpoint\n", who,
                why.msg);
        char bad[PATH_MAX];
        snprintf(bad, sizeof bad, "%s", out);
        found = ckpt_find_latest_before(path, ckpt_dir_step(bad), out, n, e);
        if (found < 0) return -1;
        if (!found)
            return ust_errf(e,
                            "%s: checkpoint %s failed verification and no earlier complete "
                            "checkpoint is in %s",
                            who, bad, path);
    }
    return 0;
}

int ckpt_load_config(const char *step, const char *who, ust_config *c, ust_err *e) {
    ckpt_reader *r = ckpt_open(step, e);
    if (!r) return -1;
    cJSON *j = cJSON_Parse(ckpt_state_json(r));
    ckpt_close(r);
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(j, "config");
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s/state.json (config)", step);
    int rc = 0;
    if (!cJSON_IsString(y))
        rc = ust_errf(e, "%s: %s/state.json is not a ustrain checkpoint state (no \"config\" text)",
                      who, step);
    cfg_defaults(c);
    if (!rc) rc = cfg_load_string(c, y->valuestring, where, e);
    if (!rc) rc = cfg_validate(c, 0, e);
    cJSON_Delete(j);
    return rc;
}
