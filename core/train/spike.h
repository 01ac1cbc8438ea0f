/* spike: llm.c's outlier detector. The z-score of a value against the last `size` values pushed:
 * (x - mean) / std over that window, 0 until the window is full (or when its std is 0). The
 * trainer keeps one for the loss and one for the gradient norm, pushes only the steps it did not
 * call a spike (so one spike does not widen the window for the next), and since both values are
 * global every rank takes the same decision. */
#ifndef UST_SPIKE_H
#define UST_SPIKE_H

typedef struct {
    double *v;
    int size, count, next;
} spike_window;

void spike_init(spike_window *w, int size);
void spike_free(spike_window *w);
double spike_z(const spike_window *w, double x);
void spike_push(spike_window *w, double x);

#endif
