/* model_trace.c: logging.trace's op groups. A unit (a layer, its experts, the embeddings, the
 * head) is the group of ops between its hooks, the same group a sharding layer gathers and
 * reduces; each of its forward, backward and input-only backward passes is one span, nested in
 * the pipeline action that runs it. On an asynchronous backend the times are the host's issue
 * times (no sync is added: tracing must not change the step's overlap). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "model_state.h"
#include "trace.h"

/* The length of name without its last dotted part ("model.norm.weight": "model.norm"). */
static int stem(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? (int)(dot - name) : (int)strlen(name);
}

/* A unit's name: the common prefix of its parameters' names, cut to whole parts, when it names
 * more than a top-level part ("model.layers.3", "model.layers.3.mlp.experts"); else its first
 * and last tensors' stems ("model.norm+lm_head"; one tensor: "model.embed_tokens"). */
static void unit_name(const model *m, int u, char *out, size_t cap) {
    const char *first = NULL, *last = NULL;
    size_t len = 0;
    for (int i = 0; i < m->tab.nparams; i++) {
        if (m->tab.param_unit[i] != u) continue;
        const char *s = m->tab.params[i].name;
        if (!first) first = s, len = strlen(s);
        for (size_t k = 0; k < len; k++)
            if (s[k] != first[k]) len = k;
        last = s;
    }
    if (!first || !first[0]) {
        snprintf(out, cap, "unit %d", u);
        return;
    }
    if (len < strlen(first) && first[len] != '.') /* cut back to a whole part */
        while (len > 0 && first[len - 1] != '.') len--;
    while (len > 0 && first[len - 1] == '.') len--;
    if (memchr(first, '.', len) && len < strlen(first))
        snprintf(out, cap, "%.*s", (int)len, first);
    else if (stem(first) == stem(last) && !strncmp(first, last, (size_t)stem(first)))
        snprintf(out, cap, "%.*s", stem(first), first);
    else
        snprintf(out, cap, "%.*s+%.*s", stem(first), first, stem(last), last);
}

void model_set_trace(model *m, struct ust_trace *t) {
    free(m->tracing.names);
    memset(&m->tracing, 0, sizeof m->tracing);
    if (!t) return;
    m->tracing.names = calloc((size_t)m->tab.nunits + 1, sizeof *m->tracing.names);
    if (!m->tracing.names) return; /* no memory: no unit spans, the run goes on */
    for (int u = 0; u < m->tab.nunits; u++)
        unit_name(m, u, m->tracing.names[u], sizeof m->tracing.names[u]);
    m->tracing.t = t;
}

/* Called by model_hook before (after 0) and after (after 1) the sharding layer's hook: a begin
 * opens the unit's span before its hook, an end closes it after. */
void model_trace_unit(model *m, int unit, model_phase phase, int after) {
    model_tracing *tr = &m->tracing;
    int begin = phase == MODEL_FWD_BEGIN || phase == MODEL_BWD_BEGIN || phase == MODEL_BIN_BEGIN;
    if (begin == after) return;
    int cap = (int)(sizeof tr->t0 / sizeof tr->t0[0]);
    if (begin) {
        if (tr->depth < cap) tr->t0[tr->depth] = log_now_s();
        tr->depth++;
        return;
    }
    if (tr->depth == 0) return;
    tr->depth--;
    if (tr->depth >= cap || !trace_on(tr->t)) return;
    const char *kind = phase == MODEL_FWD_END ? "fwd" : phase == MODEL_BWD_END ? "bwd" : "bin";
    char name[64], args[32];
    snprintf(name, sizeof name, "%s %s", kind,
             unit >= 0 && unit < m->tab.nunits ? tr->names[unit] : "?");
    snprintf(args, sizeof args, "\"unit\": %d", unit);
    trace_span(tr->t, TRACE_COMPUTE, name, tr->t0[tr->depth], log_now_s(), args);
}
