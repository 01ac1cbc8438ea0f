/* config_tasks: eval.tasks, a list of multiple-choice tasks scored during training, read from the
 * YAML, kept as canonical flow YAML (as a blend is) and read back into cfg_task entries. */
#include "config_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *task_scalar(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* A name is a TensorBoard tag and a JSON key as it is: letters, digits, '_', '-', '.'. */
static bool task_name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < sizeof((cfg_task *)0)->name &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") == n;
}

static int task_field(const cfg_ctx *x, const cfg_key *k, int i, const char *name,
                      const yaml_node_t *v, cfg_task *d) {
    const char *s = task_scalar(v);
    if (!s)
        return cfg_fail_at(x, v->start_mark, "%s[%d].%s: expected a single value, got %s", k->path,
                           i, name, cfg_node_kind(v));
    if (!strcmp(name, "name")) {
        if (!task_name_ok(s))
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].name: expected 1 to %zu letters, digits, '_', '-' or '.', "
                               "got '%.64s'",
                               k->path, i, sizeof d->name - 1, s);
        snprintf(d->name, sizeof d->name, "%s", s);
    } else if (!strcmp(name, "path")) {
        if (!*s || strlen(s) >= sizeof d->path || strcspn(s, "\"\\\n\r\t") != strlen(s))
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].path: expected a JSONL file path of at most %zu bytes "
                               "without quotes, backslashes or control characters, got '%.64s'",
                               k->path, i, sizeof d->path - 1, s);
        snprintf(d->path, sizeof d->path, "%s", s);
    } else {
        char *end;
        errno = 0;
        long v2 = strtol(s, &end, 10);
        if (end == s || *end || errno || v2 < 1 || v2 > INT_MAX)
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].every: expected a whole number of steps >= 1, got '%s'",
                               k->path, i, s);
        d->every = (int)v2;
    }
    return 0;
}

/* Entry i: a mapping {name, path, every}, all three needed. */
static int task_entry(const cfg_ctx *x, const cfg_key *k, int i, const yaml_node_t *m,
                      cfg_task *d) {
    *d = (cfg_task){.every = 0};
    if (m->type != YAML_MAPPING_NODE)
        return cfg_fail_at(x, m->start_mark,
                           "%s[%d]: expected a mapping {name: N, path: FILE.jsonl, every: STEPS}, "
                           "got %s",
                           k->path, i, cfg_node_kind(m));
    static const char *const FIELDS[] = {"name", "path", "every", NULL};
    int seen = 0;
    for (yaml_node_pair_t *pr = m->data.mapping.pairs.start; pr < m->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        const char *name = task_scalar(kn);
        int f = name ? cfg_name_index(FIELDS, name) : -1;
        if (f < 0)
            return cfg_fail_at(x, kn->start_mark,
                               "%s[%d]: unknown key '%s' (allowed: name, path, every)", k->path, i,
                               name ? name : "(not a name)");
        if (seen & (1 << f))
            return cfg_fail_at(x, kn->start_mark, "%s[%d]: duplicate key '%s'", k->path, i, name);
        seen |= 1 << f;
        if (task_field(x, k, i, name, yaml_document_get_node(x->doc, pr->value), d)) return -1;
    }
    if (seen != 7)
        return cfg_fail_at(x, m->start_mark, "%s[%d]: needs %s", k->path, i,
                           !(seen & 1)   ? "a name"
                           : !(seen & 2) ? "a path (a JSONL file of items)"
                                         : "every (steps between evaluations)");
    return 0;
}

/* The entries of a YAML list (n at most CFG_MAX_TASKS, names distinct); -1 after the message. */
static int task_list(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v, cfg_task *d) {
    int n = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++, n++) {
        yaml_node_t *m = yaml_document_get_node(x->doc, *it);
        if (n == CFG_MAX_TASKS)
            return cfg_fail_at(x, m->start_mark, "%s: at most %d tasks", k->path, CFG_MAX_TASKS);
        if (task_entry(x, k, n, m, &d[n])) return -1;
        for (int j = 0; j < n; j++)
            if (!strcmp(d[j].name, d[n].name))
                return cfg_fail_at(x, m->start_mark, "%s[%d]: the name '%s' is task %d's already",
                                   k->path, n, d[n].name, j);
    }
    return n;
}

int cfg_load_tasks(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    cfg_task d[CFG_MAX_TASKS];
    int n = task_list(x, k, v, d);
    if (n < 0) return -1;
    char *dst = (char *)x->c + k->off;
    size_t len = 0;
    memset(dst, 0, k->size);
    for (int i = 0; i < n; i++) /* canonical flow YAML; [] (none) is kept as "" */
        len += (size_t)snprintf(dst + len, len < k->size ? k->size - len : 0,
                                "%s{name: \"%s\", path: \"%s\", every: %d}%s", i ? ", " : "[",
                                d[i].name, d[i].path, d[i].every, i == n - 1 ? "]" : "");
    if (len >= k->size) {
        memset(dst, 0, k->size);
        return cfg_fail_at(x, v->start_mark, "%s: the list is too long (at most %zu bytes)",
                           k->path, k->size - 1);
    }
    cfg_mark_set(x->c, k);
    return 0;
}

int cfg_parse_tasks(const char *text, cfg_task *out, char *why, size_t n) {
    if (!text[0]) return 0;
    ust_config scratch;
    yaml_document_t doc;
    ust_err e;
    cfg_ctx x = {.c = &scratch, .doc = &doc, .where = "eval.tasks", .is_set = true, .e = &e};
    if (cfg_load_document(&x, text, &doc)) return snprintf(why, n, "%s", e.msg), -1;
    yaml_node_t *v = yaml_document_get_root_node(&doc);
    const cfg_key k = {.path = "eval.tasks"};
    int count = v && v->type == YAML_SEQUENCE_NODE ? task_list(&x, &k, v, out) : -1;
    yaml_document_delete(&doc);
    if (count < 0) return snprintf(why, n, "not a list of tasks: %.200s", text), -1;
    return count;
}

int cfg_eval_tasks(const ust_config *c, cfg_task *out) {
    char why[512];
    int n = cfg_parse_tasks(c->eval.tasks, out, why, sizeof why);
    UST_ASSERT(n >= 0, "eval.tasks: %s", why);
    return n;
}
