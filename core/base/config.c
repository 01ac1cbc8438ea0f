/* config: YAML (libyaml document API) -> ust_config.
 * The document walk, loading a file or a string, and --set key.path=value. Errors name the
 * position (file:line:col, or the --set argument), the full key path, the offending value and
 * what is allowed; an unknown key gets a did-you-mean. The key table is config_schema.c's. */
#include "config_internal.h"
#include "fs.h"

#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- did-you-mean */

enum { NAME_MAX_LEN = 64, LEVEL_MAX = 64 };

typedef struct {
    char name[LEVEL_MAX][NAME_MAX_LEN];
    int n;
} cfg_names;

/* The names valid directly under prefix ("" = top level): keys and subsections, in table order. */
static void cfg_level_names(const char *prefix, cfg_names *out) {
    size_t pn = strlen(prefix);
    out->n = 0;
    for (size_t i = 0; i < cfg_n_keys; i++) {
        const char *p = cfg_keys[i].path;
        if (pn && (strncmp(p, prefix, pn) || p[pn] != '.')) continue;
        const char *s = pn ? p + pn + 1 : p;
        size_t len = strcspn(s, ".");
        int dup = 0;
        for (int j = 0; j < out->n; j++)
            dup |= strlen(out->name[j]) == len && !strncmp(out->name[j], s, len);
        if (dup || out->n == LEVEL_MAX || len >= NAME_MAX_LEN) continue;
        memcpy(out->name[out->n], s, len);
        out->name[out->n++][len] = 0;
    }
}

static int cfg_edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na >= NAME_MAX_LEN || nb >= NAME_MAX_LEN) return INT_MAX;
    int prev[NAME_MAX_LEN], cur[NAME_MAX_LEN];
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[nb];
}

const char *cfg_nearest(const char *name, const char *const *names, int n) {
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; i < n; i++) {
        int d = cfg_edit_distance(name, names[i]);
        if (d < best_d) best_d = d, best = names[i];
    }
    if (!best) return NULL;
    size_t longer = strlen(name) > strlen(best) ? strlen(name) : strlen(best);
    return best_d <= 2 || (size_t)best_d * 2 <= longer ? best : NULL;
}

/* The nearest valid name, if near enough to be a plausible typo; NULL otherwise. */
static const char *cfg_suggest(const cfg_names *names, const char *name) {
    const char *p[LEVEL_MAX] = {0}; /* initialized: -O1 cannot see n <= LEVEL_MAX */
    for (int i = 0; i < names->n; i++) p[i] = names->name[i];
    return cfg_nearest(name, p, names->n);
}

/* "unknown key 'train.micro_batch' (did you mean 'micro_batch_size'?)" into buf. */
static void cfg_unknown_text(const char *prefix, const char *name, char *buf, size_t n) {
    cfg_names names;
    cfg_level_names(prefix, &names);
    const char *what = *prefix ? "key" : "section";
    char path[256];
    snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", name);
    const char *best = cfg_suggest(&names, name);
    if (best) {
        snprintf(buf, n, "unknown %s '%s' (did you mean '%s'?)", what, path, best);
        return;
    }
    char list[1024];
    size_t used = 0;
    list[0] = 0;
    for (int i = 0; i < names.n && used < sizeof list; i++)
        used += snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names.name[i]);
    if (*prefix)
        snprintf(buf, n, "unknown key '%s' (valid keys in '%s': %s)", path, prefix, list);
    else
        snprintf(buf, n, "unknown section '%s' (valid sections: %s)", path, list);
}

/* ---------------------------------------------------------------- walking the YAML document */

int cfg_fail_at(const cfg_ctx *x, yaml_mark_t m, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (x->is_set) return ust_errf(x->e, "%s: %s", x->where, msg);
    return ust_errf(x->e, "%s:%zu:%zu: %s", x->where, m.line + 1, m.column + 1, msg);
}

/* libyaml's reader errors (bad UTF-8) carry only a byte offset. */
static yaml_mark_t cfg_mark_at(const char *text, size_t offset) {
    yaml_mark_t m = {offset, 0, 0};
    for (size_t i = 0; i < offset && text[i]; i++) {
        if (text[i] == '\n')
            m.line++, m.column = 0;
        else
            m.column++;
    }
    return m;
}

static int cfg_syntax_error(const cfg_ctx *x, const yaml_parser_t *p, const char *text) {
    yaml_mark_t m =
        p->error == YAML_READER_ERROR ? cfg_mark_at(text, p->problem_offset) : p->problem_mark;
    char ctx[256] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu, column %zu)", p->context,
                 p->context_mark.line + 1, p->context_mark.column + 1);
    return cfg_fail_at(x, m, "YAML syntax error: %s%s", p->problem ? p->problem : "unreadable",
                       ctx);
}

/* libyaml's document loader scans all of the text before it returns, and its scanner checks every
 * open flow level at each token, so "[[[[..." 100,000 deep took 43 s to reject. A pass over the
 * events first stops at the first list or mapping deeper than CFG_MAX_DEPTH: the scanner looks
 * only a bounded way ahead of the event it hands out (a possible simple key goes stale after
 * 1024 characters), so this costs about as much as the first few kilobytes whatever follows. */
static int cfg_check_depth(const cfg_ctx *x, const char *text) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return ust_errf(x->e, "%s: out of memory", x->where);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    int depth = 0, rc = 0;
    for (bool end = false; !end && rc == 0;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = cfg_syntax_error(x, &p, text);
            break;
        }
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
            if (++depth > CFG_MAX_DEPTH)
                rc = cfg_fail_at(x, ev.start_mark,
                                 "lists and mappings nested deeper than %d levels (the limit; a "
                                 "config needs 3)",
                                 CFG_MAX_DEPTH);
        } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        end = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

/* Parses text as exactly one YAML document into d; the caller deletes d when this returns 0. */
int cfg_load_document(const cfg_ctx *x, const char *text, yaml_document_t *d) {
    yaml_parser_t p;
    if (strlen(text) > CFG_MAX_BYTES)
        return cfg_fail_at(x, cfg_mark_at(text, CFG_MAX_BYTES),
                           "config is larger than %d MiB (the limit)", CFG_MAX_BYTES >> 20);
    if (cfg_check_depth(x, text)) return -1;
    if (!yaml_parser_initialize(&p)) return ust_errf(x->e, "%s: out of memory", x->where);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    int rc = 0;
    if (!yaml_parser_load(&p, d)) { /* libyaml frees d on failure */
        rc = cfg_syntax_error(x, &p, text);
        yaml_parser_delete(&p);
        return rc;
    }
    yaml_document_t extra;
    if (!yaml_parser_load(&p, &extra)) {
        rc = cfg_syntax_error(x, &p, text);
    } else {
        yaml_node_t *r = yaml_document_get_root_node(&extra);
        if (r) rc = cfg_fail_at(x, r->start_mark, "expected one YAML document, found a second");
        yaml_document_delete(&extra);
    }
    yaml_parser_delete(&p);
    if (rc) yaml_document_delete(d);
    return rc;
}

const char *cfg_node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return "a single value";
    }
}

static bool cfg_node_is_null(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE &&
           cfg_is_null((const char *)n->data.scalar.value,
                       n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE);
}

/* A YAML list of scalars for a K_LIST key, as the "a,b,c" text cfg_put_list reads; each item is
 * checked where it stands, so its error has its own line:col. */
static int cfg_load_list(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    char text[512] = "", why[1024];
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(x->doc, *it);
        const char *s = item->type == YAML_SCALAR_NODE ? (const char *)item->data.scalar.value : "";
        int rc = item->type != YAML_SCALAR_NODE || item->data.scalar.length > 32 ||
                         strlen(text) + item->data.scalar.length + 2 > sizeof text
                     ? -1
                     : cfg_list_item(k, s, item->data.scalar.length, why, sizeof why);
        if (rc == -2) return cfg_fail_at(x, item->start_mark, "%s: %s", k->path, why);
        if (rc)
            return cfg_fail_at(x, item->start_mark,
                               "%s: expected a list of integers in %.0f..%.0f, got %s%s%s", k->path,
                               k->lo, k->hi, item->type == YAML_SCALAR_NODE ? "'" : "",
                               item->type == YAML_SCALAR_NODE ? s : cfg_node_kind(item),
                               item->type == YAML_SCALAR_NODE ? "'" : "");
        if (*text) strcat(text, ",");
        strcat(text, s);
    }
    if (cfg_put(x->c, k, *text ? text : "null", true, why, sizeof why))
        return cfg_fail_at(x, v->start_mark, "%s: %s", k->path, why);
    cfg_mark_set(x->c, k);
    return 0;
}

static int cfg_load_leaf(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    if (k->kind == K_LIST && v->type == YAML_SEQUENCE_NODE) return cfg_load_list(x, k, v);
    if (k->kind == K_DATA && v->type == YAML_SEQUENCE_NODE) return cfg_load_blend(x, k, v);
    if (k->kind == K_TASKS && v->type == YAML_SEQUENCE_NODE) return cfg_load_tasks(x, k, v);
    if (v->type != YAML_SCALAR_NODE)
        return cfg_fail_at(x, v->start_mark, "%s: expected a single value, got %s", k->path,
                           cfg_node_kind(v));
    const char *s = (const char *)v->data.scalar.value;
    if (strlen(s) != v->data.scalar.length)
        return cfg_fail_at(x, v->start_mark, "%s: value contains a NUL character", k->path);
    char why[1024];
    if (cfg_put(x->c, k, s, v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, why, sizeof why))
        return cfg_fail_at(x, v->start_mark, "%s: %s", k->path, why);
    cfg_mark_set(x->c, k);
    return 0;
}

/* A key of a mapping must be a plain name, without dots, and not repeat an earlier key. */
static int cfg_check_key(const cfg_ctx *x, const yaml_node_t *map, const yaml_node_pair_t *pair,
                         const char *prefix) {
    yaml_node_t *kn = yaml_document_get_node(x->doc, pair->key);
    const char *in = *prefix ? prefix : "the top level";
    if (kn->type != YAML_SCALAR_NODE)
        return cfg_fail_at(x, kn->start_mark, "keys must be names, got %s as a key in %s",
                           cfg_node_kind(kn), in);
    const char *name = (const char *)kn->data.scalar.value;
    if (strchr(name, '.'))
        return cfg_fail_at(x, kn->start_mark,
                           "key '%s' in %s contains '.'; nest it instead (a: {b: 1}, not a.b: 1)",
                           name, in);
    for (const yaml_node_pair_t *q = map->data.mapping.pairs.start; q < pair; q++) {
        yaml_node_t *qn = yaml_document_get_node(x->doc, q->key);
        if (qn->type == YAML_SCALAR_NODE && !strcmp((const char *)qn->data.scalar.value, name))
            return cfg_fail_at(x, kn->start_mark,
                               "duplicate key '%s%s%s' (first given at line %zu, column %zu)",
                               prefix, *prefix ? "." : "", name, qn->start_mark.line + 1,
                               qn->start_mark.column + 1);
    }
    return 0;
}

static int cfg_load_mapping(const cfg_ctx *x, const yaml_node_t *map, const char *prefix);

static int cfg_load_section(const cfg_ctx *x, const yaml_node_t *v, const char *path) {
    if (cfg_node_is_null(v)) return 0; /* "model:" with every key commented out */
    if (v->type != YAML_MAPPING_NODE)
        return cfg_fail_at(x, v->start_mark,
                           "'%s' is a section and needs a mapping of keys, got %s", path,
                           cfg_node_kind(v));
    return cfg_load_mapping(x, v, path);
}

static int cfg_load_mapping(const cfg_ctx *x, const yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        if (cfg_check_key(x, map, pr, prefix)) return -1;
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(x->doc, pr->value);
        const char *name = (const char *)kn->data.scalar.value;
        char path[256];
        snprintf(path, sizeof path, "%s%s%.*s", prefix, *prefix ? "." : "", NAME_MAX_LEN, name);
        const cfg_key *k = strlen(name) < NAME_MAX_LEN ? cfg_find_key(path) : NULL;
        int rc;
        if (k)
            rc = cfg_load_leaf(x, k, vn);
        else if (strlen(name) < NAME_MAX_LEN && cfg_is_section(path))
            rc = cfg_load_section(x, vn, path);
        else {
            char msg[1400];
            cfg_unknown_text(prefix, name, msg, sizeof msg);
            rc = cfg_fail_at(x, kn->start_mark, "%s", msg);
        }
        if (rc) return rc;
    }
    return 0;
}

/* A per-layer model.sliding_window list of the wrong length, where it stands in the file (the
 * model's own n_layer as this document leaves it; cfg_validate checks the final config too). */
static int cfg_check_window_list(const cfg_ctx *x, const yaml_node_t *root) {
    const yaml_node_t *model = NULL, *w = NULL;
    for (const yaml_node_pair_t *p = root->data.mapping.pairs.start;
         p < root->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(x->doc, p->key);
        if (k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, "model"))
            model = yaml_document_get_node(x->doc, p->value);
    }
    for (const yaml_node_pair_t *p =
             model && model->type == YAML_MAPPING_NODE ? model->data.mapping.pairs.start : NULL;
         p && p < model->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(x->doc, p->key);
        if (k->type == YAML_SCALAR_NODE &&
            !strcmp((const char *)k->data.scalar.value, "sliding_window"))
            w = yaml_document_get_node(x->doc, p->value);
    }
    if (!w || w->type != YAML_SEQUENCE_NODE) return 0;
    long n = w->data.sequence.items.top - w->data.sequence.items.start;
    if (n <= 1 || n == x->c->model.n_layer) return 0;
    return cfg_fail_at(x, w->start_mark,
                       "model.sliding_window has %ld entries; it takes one window for every "
                       "layer or one per layer (model.n_layer = %d)",
                       n, x->c->model.n_layer);
}

static int cfg_load_root(const cfg_ctx *x) {
    yaml_node_t *root = yaml_document_get_root_node(x->doc);
    /* an empty file is more likely a truncated copy or the wrong path than a wish for every
     * default; `{}` says the latter */
    if (!root || cfg_node_is_null(root))
        return ust_errf(x->e,
                        "%s: config file is empty (no sections: only whitespace, comments or a "
                        "null document); write the keys that differ from the defaults, or {} "
                        "for all defaults",
                        x->where);
    if (root->type != YAML_MAPPING_NODE)
        return cfg_fail_at(
            x, root->start_mark,
            "the top level must be a mapping of sections (run:, model:, ...), got %s",
            cfg_node_kind(root));
    if (cfg_load_mapping(x, root, "")) return -1;
    return cfg_check_window_list(x, root);
}

/* ---------------------------------------------------------------- public: loading */

/* Where a run writes, unless the config says: run.out_dir is runs/<run.name>, checkpoint.dir
 * <out_dir>/ckpt and logging.metrics_file <out_dir>/metrics.jsonl (the defaults are those of
 * run.name tiny), so two configs of different names or out_dirs never share a checkpoint. */
static void cfg_derive_paths(ust_config *c) {
    __typeof__(c->run) *r = &c->run;
    if (!cfg_was_set(c, "run.out_dir")) snprintf(r->out_dir, sizeof r->out_dir, "runs/%s", r->name);
    if (!cfg_was_set(c, "checkpoint.dir"))
        snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%s/ckpt", r->out_dir);
    if (!cfg_was_set(c, "logging.metrics_file"))
        snprintf(c->logging.metrics_file, sizeof c->logging.metrics_file, "%s/metrics.jsonl",
                 r->out_dir);
}

static void cfg_set_source(ust_config *c, const char *name) {
    memset(c->source, 0, sizeof c->source);
    snprintf(c->source, sizeof c->source, "%s", name);
}

int cfg_load_string(ust_config *c, const char *yaml, const char *name, ust_err *e) {
    ust_config tmp = *c; /* a failed load leaves c as it was */
    yaml_document_t doc;
    cfg_ctx x = {.c = &tmp, .doc = &doc, .where = name, .e = e};
    if (cfg_load_document(&x, yaml, &doc)) return -1;
    int rc = cfg_load_root(&x);
    yaml_document_delete(&doc);
    if (rc) return rc;
    cfg_set_source(&tmp, name);
    cfg_apply_implied(&tmp);
    cfg_derive_paths(&tmp);
    *c = tmp;
    return 0;
}

int cfg_load_file(ust_config *c, const char *path, ust_err *e) {
    ust_err inner;
    FILE *f = fs_fopen_stream(path, &inner);
    if (!f) return ust_errf(e, "config %s", inner.msg);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    /* at most one byte past the limit: cfg_load_document reports where the limit falls, and
     * /dev/zero or a mistaken multi-gigabyte path is not read to the end */
    for (size_t got; buf && n <= CFG_MAX_BYTES && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) free(buf);
            buf = grown, cap *= 2;
        }
    }
    int read_err = ferror(f);
    fclose(f);
    if (!buf) return ust_errf(e, "%s: out of memory reading config", path);
    if (read_err) {
        free(buf);
        return ust_errf(e, "%s: read error", path);
    }
    buf[n] = 0;
    int rc = strlen(buf) != n ? ust_errf(e, "%s: config contains a NUL byte", path)
                              : cfg_load_string(c, buf, path, e);
    free(buf);
    return rc;
}

/* "model.moe.top_k" -> its key, or an error naming the first component that is not valid there. */
static const cfg_key *cfg_resolve(const cfg_ctx *x, const char *path) {
    yaml_mark_t none = {0, 0, 0};
    char prefix[256], full[256];
    for (size_t start = 0;;) {
        size_t end = start + strcspn(path + start, ".");
        snprintf(prefix, sizeof prefix, "%.*s", start ? (int)start - 1 : 0, path);
        snprintf(full, sizeof full, "%.*s", (int)end, path);
        bool last = path[end] == 0;
        const cfg_key *k = cfg_find_key(full);
        if (k && last) return k;
        if (k) {
            cfg_fail_at(x, none, "'%s' is a key, not a section", full);
            return NULL;
        }
        if (!cfg_is_section(full)) {
            char msg[1400];
            cfg_unknown_text(prefix, full + start, msg, sizeof msg);
            cfg_fail_at(x, none, "%s", msg);
            return NULL;
        }
        if (last) {
            const cfg_key *first = cfg_keys;
            while (strncmp(first->path, full, end) || first->path[end] != '.') first++;
            cfg_fail_at(x, none, "'%s' is a section; --set needs one of its keys, e.g. %s=%s", full,
                        first->path, first->def);
            return NULL;
        }
        start = end + 1;
    }
}

int cfg_set(ust_config *c, const char *assignment, ust_err *e) {
    char where[UST_PATH_MAX + 64], path[256];
    snprintf(where, sizeof where, "--set %s", assignment);
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment || (size_t)(eq - assignment) >= sizeof path)
        return ust_errf(e, "%s: expected key.path=value, e.g. --set train.steps=100", where);
    snprintf(path, sizeof path, "%.*s", (int)(eq - assignment), assignment);

    ust_config tmp = *c;
    yaml_document_t doc;
    cfg_ctx x = {.c = &tmp, .doc = &doc, .where = where, .is_set = true, .e = e};
    const cfg_key *k = cfg_resolve(&x, path);
    if (!k || cfg_load_document(&x, eq + 1, &doc)) return -1;
    yaml_node_t *v = yaml_document_get_root_node(&doc);
    int rc;
    if (v) {
        rc = cfg_load_leaf(&x, k, v);
    } else { /* "key=" is an empty document: null */
        char why[1024];
        rc = cfg_put(&tmp, k, "", true, why, sizeof why);
        if (rc) ust_errf(e, "%s: %s: %s", where, k->path, why);
        if (!rc) cfg_mark_set(&tmp, k);
    }
    yaml_document_delete(&doc);
    if (rc == 0) cfg_apply_implied(&tmp), cfg_derive_paths(&tmp);
    if (rc == 0) *c = tmp;
    return rc;
}
