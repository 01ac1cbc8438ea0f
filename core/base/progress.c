/* Progress lines on a terminal (progress.h). */
#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

void progress_begin(progress *p, const char *what, double total, bool bytes) {
    *p = (progress){.what = what, .total = total, .bytes = bytes};
    p->on = total > 0 && isatty(STDERR_FILENO);
    /* UST_PROGRESS_DELAY_S (tests): how long an operation runs before its line shows */
    const char *d = getenv("UST_PROGRESS_DELAY_S");
    p->start = p->on ? log_now_s() - 1.0 + (d ? atof(d) : 1.0) : 0;
}

void progress_add(progress *p, double delta) { progress_update(p, p->done + delta); }

void progress_update(progress *p, double done) {
    p->done = done;
    if (!p->on) return;
    double now = log_now_s();
    if (now - p->start < 1.0 || now - p->last < 0.5) return;
    p->last = now;
    double pct = 100.0 * done / p->total;
    if (p->bytes) {
        double g = p->total >= 1e9 ? 1e9 : 1e6;
        fprintf(stderr, "\r%s %3.0f%% (%.1f of %.1f %s)\033[K", p->what, pct, done / g,
                p->total / g, g == 1e9 ? "GB" : "MB");
    } else {
        fprintf(stderr, "\r%s %3.0f%% (%.0f of %.0f)\033[K", p->what, pct, done, p->total);
    }
    fflush(stderr);
}

void progress_end(progress *p) {
    if (p->on && p->last > 0) fprintf(stderr, "\r\033[K");
    p->on = false;
}
