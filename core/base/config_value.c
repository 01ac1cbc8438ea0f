/* config_value: one scalar of the YAML or --set into its field (cfg_put), with the messages of
 * a wrong type or an out-of-range value, and the same per-key checks over a whole struct. */
#include "config_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- scalar values */

bool cfg_is_null(const char *s, bool plain) {
    return plain && (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
                     !strcmp(s, "NULL"));
}

/* Integer keys without an explicit upper bound are bounded only by their C type. */
static bool cfg_has_hi(const cfg_key *k) {
    return k->kind == K_DBL ? k->hi != INFINITY : k->kind == K_INT && k->hi < INT_MAX;
}

/* What the allowed range is, phrased for the side that v violates. */
static void cfg_range_text(const cfg_key *k, double v, char *buf, size_t n) {
    if (cfg_has_hi(k) && k->kind != K_DBL)
        snprintf(buf, n, "must be in %.0f..%.0f", k->lo, k->hi);
    else if (cfg_has_hi(k))
        snprintf(buf, n, "must be in %s%g, %g%s", k->flags & LO_OPEN ? "(" : "[", k->lo, k->hi,
                 k->flags & HI_OPEN ? ")" : "]");
    else if (v <= k->lo || k->kind == K_DBL)
        snprintf(buf, n, "must be %s %g", k->flags & LO_OPEN ? ">" : ">=", k->lo);
    else
        snprintf(buf, n, "must fit in a %d-bit integer", k->kind == K_INT ? 32 : 64);
}

static bool cfg_in_range(const cfg_key *k, double v) {
    bool lo_ok = k->flags & LO_OPEN ? v > k->lo : v >= k->lo;
    bool hi_ok = k->flags & HI_OPEN ? v < k->hi : v <= k->hi;
    return lo_ok && hi_ok;
}

/* "out of range" message into why; returns -1. */
static int cfg_range_error(const cfg_key *k, const char *shown, double v, char *why, size_t n) {
    char range[96];
    cfg_range_text(k, v, range, sizeof range);
    snprintf(why, n, "%s is out of range (%s)", shown, range);
    return -1;
}

void cfg_list_names(const char *const *names, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; names[i] && used < n; i++)
        used += snprintf(buf + used, n - used, "%s%s", i ? ", " : "", names[i]);
}

int cfg_name_index(const char *const *names, const char *s) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static int cfg_quoted_error(const char *what, const char *s, char *why, size_t n) {
    snprintf(why, n, "expected %s, got the quoted string \"%s\" (remove the quotes)", what, s);
    return -1;
}

static int cfg_put_int(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                       size_t n) {
    const char *what = k->kind == K_U64 ? "a non-negative integer" : "an integer";
    if ((k->flags & AUTO) && plain && !strcmp(s, "auto")) { /* resolved by cfg_resolve_auto */
        int zero = 0;
        memcpy(dst, &zero, sizeof zero);
        return 0;
    }
    if (!plain) return cfg_quoted_error(what, s, why, n);
    size_t sign = (s[0] == '-' || s[0] == '+');
    if (!s[sign] || strspn(s + sign, "0123456789") != strlen(s + sign) ||
        (k->kind == K_U64 && s[0] == '-')) {
        snprintf(why, n, "expected %s, got '%s'", what, s);
        return -1;
    }
    errno = 0;
    if (k->kind == K_U64) {
        uint64_t v = strtoull(s, NULL, 10);
        if (errno) return cfg_range_error(k, s, INFINITY, why, n);
        memcpy(dst, &v, sizeof v);
        return 0;
    }
    long long v = strtoll(s, NULL, 10);
    if (errno || !cfg_in_range(k, (double)v)) return cfg_range_error(k, s, (double)v, why, n);
    if (k->kind == K_INT) {
        int iv = (int)v; /* the range of every K_INT key lies within int */
        memcpy(dst, &iv, sizeof iv);
    } else {
        int64_t lv = v;
        memcpy(dst, &lv, sizeof lv);
    }
    return 0;
}

static int cfg_put_double(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                          size_t n) {
    if (!plain) return cfg_quoted_error("a number", s, why, n);
    char *end;
    double v = strtod(s, &end);
    /* Only decimal notation: strtod would also take "nan", "inf" and hex floats. */
    if (!*s || *end || strspn(s, "0123456789+-.eE") != strlen(s) || !isfinite(v)) {
        snprintf(why, n, "expected a number, got '%s'", s);
        return -1;
    }
    if (!cfg_in_range(k, v)) return cfg_range_error(k, s, v, why, n);
    memcpy(dst, &v, sizeof v);
    return 0;
}

static int cfg_put_bool(void *dst, const char *s, bool plain, char *why, size_t n) {
    if (!plain) return cfg_quoted_error("true or false", s, why, n);
    bool v;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
        v = true;
    else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
        v = false;
    else {
        snprintf(why, n, "expected true or false, got '%s'", s);
        return -1;
    }
    memcpy(dst, &v, sizeof v);
    return 0;
}

static int cfg_put_string(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                          size_t n) {
    char allowed[256];
    if (cfg_is_null(s, plain)) {
        if (!(k->flags & NULLABLE)) {
            snprintf(why, n, "needs a value, got null");
            return -1;
        }
        s = "";
    }
    if (strlen(s) >= k->size) {
        snprintf(why, n, "value is too long (%zu bytes, at most %zu)", strlen(s), k->size - 1);
        return -1;
    }
    if (k->names && cfg_name_index(k->names, s) < 0) {
        cfg_list_names(k->names, allowed, sizeof allowed);
        snprintf(why, n, "unknown value '%s' (allowed: %s)", s, allowed);
        return -1;
    }
    memset(dst, 0, k->size); /* whole field, so two configs compare equal with memcmp */
    memcpy(dst, s, strlen(s));
    return 0;
}

static int cfg_put_enum(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                        size_t n) {
    int v = cfg_is_null(s, plain) ? -1 : cfg_name_index(k->names, s);
    if (v < 0) {
        char allowed[256];
        cfg_list_names(k->names, allowed, sizeof allowed);
        snprintf(why, n, "unknown value '%s' (allowed: %s)", cfg_is_null(s, plain) ? "null" : s,
                 allowed);
        return -1;
    }
    memcpy(dst, &v, sizeof v);
    return 0;
}

/* One list item (n chars at p) in k's range, else the reason in why. Parsed whole and in 64 bits:
 * atoi would read 4294967297 as 1. */
int cfg_list_item(const cfg_key *k, const char *p, size_t n, char *why, size_t wn) {
    char item[32];
    if (n == 0 || n >= sizeof item || strspn(p, "0123456789") < n) return -1;
    snprintf(item, sizeof item, "%.*s", (int)n, p);
    errno = 0;
    long long v = strtoll(item, NULL, 10);
    if (errno || v < k->lo || v > k->hi)
        return snprintf(why, wn, "item %s is out of range (must be in %.0f..%.0f)", item, k->lo,
                        k->hi),
               -2;
    return 0;
}

/* "4, 4,2 ,2" or "[4,4,2,2]" -> "4,4,2,2"; every item an integer in k's range. */
static int cfg_put_list(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                        size_t n) {
    char out[256] = "";
    if (cfg_is_null(s, plain) || !*s) {
        memset(dst, 0, k->size);
        return 0;
    }
    const char *p = s + (*s == '[');
    size_t len = strlen(p) - (*s == '[' && p[strlen(p) - 1] == ']');
    for (size_t i = 0; i <= len;) {
        size_t j = i;
        while (j < len && p[j] != ',') j++;
        size_t a = i, b = j;
        while (a < b && p[a] == ' ') a++;
        while (b > a && p[b - 1] == ' ') b--;
        int rc = cfg_list_item(k, p + a, b - a, why, n);
        if (rc == -1) snprintf(why, n, "expected a list of positive integers, got '%s'", s);
        if (rc) return -1;
        if (strlen(out) + (b - a) + 2 > sizeof out || strlen(out) + (b - a) + 2 > k->size)
            return snprintf(why, n, "list is too long: '%s'", s), -1;
        if (*out) strcat(out, ",");
        strncat(out, p + a, b - a);
        i = j + 1;
    }
    memset(dst, 0, k->size);
    memcpy(dst, out, strlen(out));
    return 0;
}

bool cfg_is_blend_text(const char *s) {
    return strncmp(s, BLEND_PREFIX, strlen(BLEND_PREFIX)) == 0;
}

/* Parses the scalar s (plain: unquoted in the YAML) into k's field of c. On error writes the
 * reason, without position or key, into why. */
int cfg_put(ust_config *c, const cfg_key *k, const char *s, bool plain, char *why, size_t n) {
    void *dst = (char *)c + k->off;
    if (k->kind != K_STR && k->kind != K_DATA && k->kind != K_ENUM && k->kind != K_LIST &&
        k->kind != K_TASKS && cfg_is_null(s, plain)) {
        snprintf(why, n, "needs a value, got null");
        return -1;
    }
    switch (k->kind) {
    case K_INT:
    case K_I64:
    case K_U64:
        return cfg_put_int(dst, k, s, plain, why, n);
    case K_DBL:
        return cfg_put_double(dst, k, s, plain, why, n);
    case K_BOOL:
        return cfg_put_bool(dst, s, plain, why, n);
    case K_STR:
        return cfg_put_string(dst, k, s, plain, why, n);
    case K_DATA:
        if (cfg_is_blend_text(s)) /* that text is the form a list is kept in */
            return snprintf(why, n, "a list of datasets is written as a YAML list, not a string"),
                   -1;
        return cfg_put_string(dst, k, s, plain, why, n);
    case K_ENUM:
        return cfg_put_enum(dst, k, s, plain, why, n);
    case K_LIST:
        return cfg_put_list(dst, k, s, plain, why, n);
    case K_TASKS:
        if (cfg_is_null(s, plain)) return memset(dst, 0, k->size), 0;
        return snprintf(why, n,
                        "expected a list of tasks [{name: N, path: FILE.jsonl, every: STEPS}] or "
                        "null, got '%.64s'",
                        s),
               -1;
    }
    return -1;
}

/* ---------------------------------------------------------------- the per-key checks of
 * cfg_validate */

static double cfg_number(const ust_config *c, const cfg_key *k) {
    const char *p = (const char *)c + k->off;
    int i;
    int64_t l;
    uint64_t u;
    double d;
    switch (k->kind) {
    case K_INT:
        return memcpy(&i, p, sizeof i), i;
    case K_I64:
        return memcpy(&l, p, sizeof l), (double)l;
    case K_U64:
        return memcpy(&u, p, sizeof u), (double)u;
    case K_DBL:
        return memcpy(&d, p, sizeof d), d;
    default:
        return 0;
    }
}

/* The per-key checks of loading, applied to a struct that code may have changed directly. */
int cfg_check_value(const ust_config *c, const cfg_key *k, char *why, size_t n) {
    const char *p = (const char *)c + k->off;
    char shown[64];
    if (k->kind == K_DATA) {
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "string is not terminated"), -1;
        cfg_dataset d[CFG_MAX_BLEND];
        if (cfg_is_blend_text(p) && cfg_parse_sets(p, d, why, n) < 0) return -1;
        return 0;
    }
    if (k->kind == K_TASKS) {
        cfg_task d[CFG_MAX_TASKS];
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "string is not terminated"), -1;
        return cfg_parse_tasks(p, d, why, n) < 0 ? -1 : 0;
    }
    if (k->kind == K_STR) {
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "string is not terminated"), -1;
        if (k->names && cfg_name_index(k->names, p) < 0) {
            char allowed[256];
            cfg_list_names(k->names, allowed, sizeof allowed);
            return snprintf(why, n, "unknown value '%s' (allowed: %s)", p, allowed), -1;
        }
        return 0;
    }
    if (k->kind == K_ENUM) {
        int v, count = 0;
        memcpy(&v, p, sizeof v);
        while (k->names[count]) count++;
        if (v < 0 || v >= count) return snprintf(why, n, "invalid enum value %d", v), -1;
        return 0;
    }
    if (k->kind == K_LIST) {
        char copy[256];
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "list is not terminated"), -1;
        return cfg_put_list(copy, k, p, true, why, n);
    }
    if (k->kind == K_BOOL || k->kind == K_U64) return 0;
    double v = cfg_number(c, k);
    if (v == 0 && (k->flags & AUTO)) return 0; /* "auto": cfg_validate_world needs the world */
    if (isfinite(v) && cfg_in_range(k, v))
        return 0; /* formatted only to say why not: the
                   * planner validates ~10^5 layouts */
    snprintf(shown, sizeof shown, "%.17g", v);
    if (!isfinite(v)) return snprintf(why, n, "%s is not a finite number", shown), -1;
    return cfg_range_error(k, shown, v, why, n);
}
