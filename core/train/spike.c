#include "spike.h"

#include <math.h>
#include <stdlib.h>

#include "error.h"

void spike_init(spike_window *w, int size) {
    w->v = calloc((size_t)size, sizeof *w->v);
    UST_ASSERT(w->v, "out of memory (spike window of %d)", size);
    w->size = size, w->count = 0, w->next = 0;
}

void spike_free(spike_window *w) {
    free(w->v);
    w->v = NULL;
}

/* Mean and variance in two passes over at most `size` values: exact enough, and cheap. */
double spike_z(const spike_window *w, double x) {
    if (!w->v || w->count < w->size || !isfinite(x)) return 0;
    double mean = 0, var = 0;
    for (int i = 0; i < w->size; i++) mean += w->v[i];
    mean /= w->size;
    for (int i = 0; i < w->size; i++) var += (w->v[i] - mean) * (w->v[i] - mean);
    double sd = sqrt(var / w->size);
    return sd > 0 ? (x - mean) / sd : 0;
}

void spike_push(spike_window *w, double x) {
    if (!w->v || !isfinite(x)) return;
    w->v[w->next] = x;
    w->next = (w->next + 1) % w->size;
    if (w->count < w->size) w->count++;
}
