/* cmd.c: what the sub-commands share. */
#include "cmd.h"

#include <stdarg.h>
#include <stdio.h>

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
