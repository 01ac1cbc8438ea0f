/* config_internal: what the config files share and nobody else sees (include config.h for that).
 * config_schema.c: the key table cfg_keys (path, field, type, default, range), key lookup,
 * cfg_defaults and cfg_dump; config_value.c: one scalar into its field (cfg_put) and the per-key
 * check of a whole struct; config.c: the YAML document walk, loading and --set; config_blend.c:
 * dataset blends; config_tasks.c: eval.tasks; config_validate.c: the cross-key rules (cfg_vfail /
 * REQUIRE), the parallel layout's in config_parallel.c. Errors keep the text and the order they
 * had in one file. */
#ifndef UST_CONFIG_INTERNAL_H
#define UST_CONFIG_INTERNAL_H

#include "config.h"

#include <stddef.h>
#include <yaml.h>

/* ---------------------------------------------------------------- the key table */

/* K_DATA: data.train / data.val, a string (a glob) or a list of datasets (cfg_load_blend) */
/* K_TASKS: eval.tasks, null or a list of {name, path, every} (cfg_load_tasks) */
typedef enum {
    K_INT,
    K_I64,
    K_U64,
    K_DBL,
    K_BOOL,
    K_STR,
    K_ENUM,
    K_LIST,
    K_DATA,
    K_TASKS
} cfg_kind;

enum { LO_OPEN = 1, HI_OPEN = 2, NULLABLE = 4, AUTO = 8 }; /* AUTO: "auto" is stored as 0 */

typedef struct {
    const char *path; /* "model.moe.top_k" */
    cfg_kind kind;
    size_t off, size;
    const char *def; /* the default, written as in YAML */
    double lo, hi;   /* numbers: allowed range, closed unless LO_OPEN / HI_OPEN */
    int flags;
    const char *const *names; /* K_ENUM: value i is names[i]; K_STR: the allowed strings */
} cfg_key;

/* config_schema.c */
extern const cfg_key cfg_keys[];
extern const size_t cfg_n_keys;
/* the names of some enums, for messages (value i is names[i]) */
extern const char *const cfg_pp_schedule_names[];
extern const char *const cfg_cp_comm_names[];
extern const char *const cfg_data_format_names[];
void cfg_mark_set(ust_config *c, const cfg_key *k);
const cfg_key *cfg_find_key(const char *path);
bool cfg_is_section(const char *path);

/* ---------------------------------------------------------------- config_value.c */

bool cfg_is_null(const char *s, bool plain);
void cfg_list_names(const char *const *names, char *buf, size_t n);
int cfg_name_index(const char *const *names, const char *s);
/* One list item (n chars at p) in k's range: 0; -1 when it is not a number; -2 (the reason in
 * why) when it is out of range. */
int cfg_list_item(const cfg_key *k, const char *p, size_t n, char *why, size_t wn);
/* Parses the scalar s (plain: unquoted in the YAML) into k's field of c. On error writes the
 * reason, without position or key, into why. */
int cfg_put(ust_config *c, const cfg_key *k, const char *s, bool plain, char *why, size_t n);
/* The per-key checks of loading, applied to a struct that code may have changed directly. */
int cfg_check_value(const ust_config *c, const cfg_key *k, char *why, size_t n);

/* A list of datasets is kept in data.train / data.val as canonical flow YAML starting so. */
#define BLEND_PREFIX "[{path: "
bool cfg_is_blend_text(const char *s);

/* ---------------------------------------------------------------- config.c: the YAML walk */

typedef struct {
    ust_config *c;
    yaml_document_t *doc;
    const char *where; /* file name, or "--set key=value" */
    bool is_set;       /* --set: a position inside the value means nothing, so none is shown */
    ust_err *e;
} cfg_ctx;

int cfg_fail_at(const cfg_ctx *x, yaml_mark_t m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Parses text as exactly one YAML document into d; the caller deletes d when this returns 0. */
int cfg_load_document(const cfg_ctx *x, const char *text, yaml_document_t *d);
const char *cfg_node_kind(const yaml_node_t *n); /* "a mapping", "a list", "a single value" */

/* ---------------------------------------------------------------- config_blend.c */

/* A YAML list of datasets into data.train / data.val (k) as its canonical text. */
int cfg_load_blend(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v);
/* A blend's canonical text back into its datasets; -1 (reason in why) when it is not one. */
int cfg_parse_sets(const char *text, cfg_dataset *out, char *why, size_t n);

/* ---------------------------------------------------------------- config_tasks.c */

/* A YAML list of tasks into eval.tasks (k) as its canonical text; its text back (-1: not one). */
int cfg_load_tasks(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v);
int cfg_parse_tasks(const char *text, cfg_task *out, char *why, size_t n);

/* ---------------------------------------------------------------- config_validate.c */

/* The message, after the config's source file, into e; returns -1. */
int cfg_vfail(const ust_config *c, ust_err *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* In a function of (c, e): the first rule broken returns its message. */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) return cfg_vfail(c, e, __VA_ARGS__);                                          \
    } while (0)

/* config_parallel.c: the layout of tp, pp, cp and ep against the model and the batch. */
int cfg_validate_parallel(const ust_config *c, ust_err *e);

/* Keys whose default follows another key, set after every load and --set: parallel.vpp, when
 * not given, is 2 under dualpipe/dualpipev (each rank holds two stages) and 1 otherwise. */
void cfg_apply_implied(ust_config *c);

#endif
