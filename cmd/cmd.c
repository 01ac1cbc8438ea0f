/* cmd.c: what the sub-commands share: usage errors, --help, and the strict parsing of every
 * numeric option (the whole string, range-checked, 64-bit), so that `--world abc` or
 * `--world 2147483648` is an error naming the value and the range instead of a silent 0 or a
 * wrapped int. */
#include "cmd.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int cmd_usage_error(const char *who, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", who);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s\n", hint);
    return UST_EXIT_USAGE;
}

bool cmd_wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
    return false;
}

int cmd_print_usage(const char *usage) {
    fputs(usage, stdout);
    if (usage[0] && usage[strlen(usage) - 1] != '\n') fputc('\n', stdout);
    return 0;
}

static int cmd_bad_value(const cmd_who *w, const char *opt, const char *s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int cmd_bad_value(const cmd_who *w, const char *opt, const char *s, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cmd_usage_error(w->who, w->hint, "%s %s: expected %s", opt, s, what);
}

int cmd_int_opt(const cmd_who *w, const char *opt, const char *s, long long lo, long long hi,
                long long *out) {
    /* strtoll alone would skip leading blanks, take "12abc" as 12 and saturate on overflow */
    const char *digits = s + (s[0] == '-' || s[0] == '+');
    char *end;
    errno = 0;
    long long v = isdigit((unsigned char)digits[0]) ? strtoll(s, &end, 10) : 0;
    if (!isdigit((unsigned char)digits[0]) || *end || errno || v < lo || v > hi)
        return cmd_bad_value(w, opt, s, "%lld..%lld (a whole number)", lo, hi);
    *out = v;
    return 0;
}

/* A decimal number (no hex, nan or inf, which strtod would take) at the start of s; returns
 * where it ends, or NULL. */
static const char *cmd_number(const char *s, double *v) {
    size_t n = strspn(s, "0123456789+-.eE");
    if (n == 0 || !(isdigit((unsigned char)s[0]) || s[0] == '.' || s[0] == '-' || s[0] == '+'))
        return NULL;
    char buf[64], *end;
    if (n >= sizeof buf) return NULL;
    memcpy(buf, s, n), buf[n] = 0;
    *v = strtod(buf, &end);
    if (end == buf || !isfinite(*v)) return NULL;
    return s + (end - buf);
}

static void cmd_range_text(char *buf, size_t n, double lo, double hi, int open) {
    if (hi == INFINITY)
        snprintf(buf, n, "a number %s %g", open & CMD_LO_OPEN ? ">" : ">=", lo);
    else if (lo == -INFINITY)
        snprintf(buf, n, "a number %s %g", open & CMD_HI_OPEN ? "below" : "<=", hi);
    else
        snprintf(buf, n, "a number in %s%g, %g%s", open & CMD_LO_OPEN ? "(" : "[", lo, hi,
                 open & CMD_HI_OPEN ? ")" : "]");
}

static bool cmd_in_range(double v, double lo, double hi, int open) {
    return (open & CMD_LO_OPEN ? v > lo : v >= lo) && (open & CMD_HI_OPEN ? v < hi : v <= hi);
}

int cmd_num_opt(const cmd_who *w, const char *opt, const char *s, double lo, double hi, int open,
                double *out) {
    double v;
    const char *end = cmd_number(s, &v);
    if (!end || *end || !cmd_in_range(v, lo, hi, open)) {
        char range[96];
        cmd_range_text(range, sizeof range, lo, hi, open);
        return cmd_bad_value(w, opt, s, "%s", range);
    }
    *out = v;
    return 0;
}

/* Multiplier of a size suffix ("" -> 1); 0 if unknown. k/m/g are kept for bench comm's
 * historical lower-case spelling. */
static double cmd_size_suffix(const char *u) {
    static const struct {
        const char *s;
        double m;
    } t[] = {{"", 1},         {"B", 1},      {"K", 0x1p10},   {"k", 0x1p10},   {"KiB", 0x1p10},
             {"KB", 1e3},     {"M", 0x1p20}, {"m", 0x1p20},   {"MiB", 0x1p20}, {"MB", 1e6},
             {"G", 0x1p30},   {"g", 0x1p30}, {"GiB", 0x1p30}, {"GB", 1e9},     {"T", 0x1p40},
             {"TiB", 0x1p40}, {"TB", 1e12}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(u, t[i].s) == 0) return t[i].m;
    return 0;
}

int cmd_size_opt(const cmd_who *w, const char *opt, const char *s, double lo, double hi,
                 double *out) {
    double v, m = 0;
    const char *end = cmd_number(s, &v);
    if (end) m = cmd_size_suffix(end);
    if (!end || m == 0 || !cmd_in_range(v * m, lo, hi, 0))
        return cmd_bad_value(w, opt, s,
                             "a size from %.0f to %.0f bytes, such as 4096, 64K, 80GiB or 141GB "
                             "(K/M/G/T and KiB..TiB: powers of 1024; KB..TB: powers of 1000)",
                             lo, hi);
    *out = v * m;
    return 0;
}

int cmd_set_arg(const cmd_who *w, int argc, char **argv, int i) {
    const char *v = argv[i];
    if (strchr(v, '=')) return 0;
    if (i + 1 < argc && argv[i + 1][0] != '-' && v[0])
        return cmd_usage_error(w->who, w->hint,
                               "--set %s: expected key.path=value as one word (did you mean "
                               "--set %s=%s?)",
                               v, v, argv[i + 1]);
    return cmd_usage_error(w->who, w->hint,
                           "--set %s: expected key.path=value, e.g. --set train.steps=100", v);
}
