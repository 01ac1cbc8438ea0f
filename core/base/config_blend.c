/* config_blend: data.train / data.val as a list of datasets (a blend), read from the YAML, kept
 * as canonical flow YAML and read back into cfg_dataset entries. */
#include "config_internal.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- dataset blends
 * data.train: [{path: "web/train_NNN.bin glob", weight: 0.7}, {path: ..., weight: 0.3, format:
 * megatron}]. Each entry is checked where it stands; the list is kept as canonical flow YAML
 * (BLEND_PREFIX...), which cfg_dump writes as it is and loading turns back into the same text. */

static const char *cfg_scalar(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int cfg_blend_field(const cfg_ctx *x, const cfg_key *k, int i, const char *name,
                           const yaml_node_t *v, cfg_dataset *d) {
    const char *s = cfg_scalar(v);
    if (!s)
        return cfg_fail_at(x, v->start_mark, "%s[%d].%s: expected a single value, got %s", k->path,
                           i, name, cfg_node_kind(v));
    if (!strcmp(name, "path")) {
        if (!*s || strlen(s) >= sizeof d->path || strcspn(s, "\"\\\n\r\t") != strlen(s))
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].path: expected a glob of at most %zu bytes without quotes, "
                               "backslashes or control characters, got '%.64s'",
                               k->path, i, sizeof d->path - 1, s);
        snprintf(d->path, sizeof d->path, "%s", s);
    } else if (!strcmp(name, "weight")) {
        char *end;
        errno = 0;
        d->weight = strtod(s, &end); /* ERANGE with a nonzero result: a subnormal, kept */
        if (end == s || *end || (errno && errno != ERANGE) || !isfinite(d->weight) ||
            d->weight <= 0)
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].weight: expected a positive number, got '%s'", k->path, i,
                               s);
    } else {
        d->format = cfg_name_index(cfg_data_format_names, s);
        if (d->format < 0) {
            char allowed[128];
            cfg_list_names(cfg_data_format_names, allowed, sizeof allowed);
            return cfg_fail_at(x, v->start_mark, "%s[%d].format: unknown value '%s' (allowed: %s)",
                               k->path, i, s, allowed);
        }
    }
    return 0;
}

/* Entry i of a blend list: a mapping with path and weight, and format optionally. */
static int cfg_blend_entry(const cfg_ctx *x, const cfg_key *k, int i, const yaml_node_t *m,
                           cfg_dataset *d) {
    *d = (cfg_dataset){.format = -1};
    if (m->type != YAML_MAPPING_NODE)
        return cfg_fail_at(x, m->start_mark,
                           "%s[%d]: expected a mapping {path: GLOB, weight: W}, got %s", k->path, i,
                           cfg_node_kind(m));
    int seen = 0; /* bits: path, weight, format */
    static const char *const FIELDS[] = {"path", "weight", "format", NULL};
    for (yaml_node_pair_t *pr = m->data.mapping.pairs.start; pr < m->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        const char *name = cfg_scalar(kn);
        int f = name ? cfg_name_index(FIELDS, name) : -1;
        if (f < 0)
            return cfg_fail_at(x, kn->start_mark,
                               "%s[%d]: unknown key '%s' (allowed: path, weight, format)", k->path,
                               i, name ? name : "(not a name)");
        if (seen & (1 << f))
            return cfg_fail_at(x, kn->start_mark, "%s[%d]: duplicate key '%s'", k->path, i, name);
        seen |= 1 << f;
        if (cfg_blend_field(x, k, i, name, yaml_document_get_node(x->doc, pr->value), d)) return -1;
    }
    if ((seen & 3) != 3)
        return cfg_fail_at(x, m->start_mark, "%s[%d]: needs %s", k->path, i,
                           seen & 1 ? "a weight" : "a path (a glob of shards)");
    return 0;
}

/* The canonical text of a blend: flow YAML, weights with every digit. */
static int cfg_blend_text(const cfg_dataset *d, int n, char *out, size_t cap) {
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int w =
            snprintf(out + len, len < cap ? cap - len : 0, "%s{path: \"%s\", weight: %.17g%s%s}",
                     i ? ", " : "[", d[i].path, d[i].weight, d[i].format >= 0 ? ", format: " : "",
                     d[i].format >= 0 ? cfg_data_format_names[d[i].format] : "");
        len += (size_t)w;
    }
    int w = snprintf(out + len, len < cap ? cap - len : 0, "]");
    return len + (size_t)w < cap ? 0 : -1;
}

int cfg_load_blend(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    cfg_dataset d[CFG_MAX_BLEND];
    int n = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++, n++) {
        if (n == CFG_MAX_BLEND)
            return cfg_fail_at(x, v->start_mark, "%s: at most %d datasets in a blend", k->path,
                               CFG_MAX_BLEND);
        if (cfg_blend_entry(x, k, n, yaml_document_get_node(x->doc, *it), &d[n])) return -1;
    }
    if (n == 0)
        return cfg_fail_at(x, v->start_mark, "%s: an empty list names no datasets", k->path);
    char *dst = (char *)x->c + k->off;
    if (cfg_blend_text(d, n, dst, k->size))
        return cfg_fail_at(x, v->start_mark, "%s: the list is too long (at most %zu bytes)",
                           k->path, k->size - 1);
    return 0;
}

/* ---------------------------------------------------------------- the datasets */

/* A blend's canonical text back into its datasets; -1 (reason in why) when it is not one. */
int cfg_parse_sets(const char *text, cfg_dataset *out, char *why, size_t n) {
    ust_config scratch;
    yaml_document_t doc;
    ust_err e;
    cfg_ctx x = {.c = &scratch, .doc = &doc, .where = "data", .is_set = true, .e = &e};
    if (cfg_load_document(&x, text, &doc)) return snprintf(why, n, "%s", e.msg), -1;
    yaml_node_t *v = yaml_document_get_root_node(&doc);
    int count = 0, rc = v && v->type == YAML_SEQUENCE_NODE ? 0 : -1;
    const cfg_key k = {.path = "data"};
    for (yaml_node_item_t *it = rc ? NULL : v->data.sequence.items.start;
         it && it < v->data.sequence.items.top && rc == 0; it++, count++)
        rc = count < CFG_MAX_BLEND
                 ? cfg_blend_entry(&x, &k, count, yaml_document_get_node(&doc, *it), &out[count])
                 : -1;
    yaml_document_delete(&doc);
    if (rc) return snprintf(why, n, "not a list of datasets: %.200s", text), -1;
    return count;
}

int cfg_data_sets(const ust_config *c, int val, cfg_dataset *out) {
    const char *text = val ? c->data.val : c->data.train;
    if (!text[0]) return 0;
    if (!cfg_is_blend_text(text)) {
        out[0] = (cfg_dataset){.weight = 1, .format = -1};
        snprintf(out[0].path, sizeof out[0].path, "%s", text);
        return 1;
    }
    char why[512];
    int n = cfg_parse_sets(text, out, why, sizeof why);
    UST_ASSERT(n > 0, "data.%s: %s", val ? "val" : "train", why);
    return n;
}

int cfg_data_is_blend(const ust_config *c, int val) {
    return cfg_is_blend_text(val ? c->data.val : c->data.train);
}
