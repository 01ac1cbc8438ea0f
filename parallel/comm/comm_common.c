/* comm_common: see comm_common.h. */
#include "comm_impl.h"
#include "flight_impl.h"

#include <stdio.h>
#include <string.h>

size_t comm_dtype_size(comm_dtype t) { return t == COMM_BF16 ? 2 : 4; }

const char *comm_kind_name(comm_kind k) {
    static const char *names[COMM_NKINDS] = {"all_reduce", "all_gather", "reduce_scatter",
                                             "broadcast",  "all_to_all", "send_recv",
                                             "barrier"};
    return (unsigned)k < COMM_NKINDS ? names[k] : "?";
}

float comm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t comm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

void comm_wait_message(const ust_comm *c, comm_kind k, const int *waiting, int nwaiting,
                       const char *why, char *msg, size_t cap) {
    char peers[1024];
    size_t used = 0;
    peers[0] = 0;
    for (int i = 0; i < nwaiting && used + 16 < sizeof peers; i++)
        used += (size_t)snprintf(peers + used, sizeof peers - used, "%s%d", i ? ", " : "",
                                 c->granks[waiting[i]]);
    snprintf(msg, cap,
             "comm: %s on group '%s' (member %d of %d, global rank %d): %s; waiting on global "
             "rank%s %s",
             comm_kind_name(k), c->name, c->rank, c->size, c->granks[c->rank], why,
             nwaiting == 1 ? "" : "s", nwaiting ? peers : "(none)");
}

_Noreturn void comm_fail_wait(const ust_comm *c, comm_kind k, const int *waiting, int nwaiting,
                              const char *why) {
    char msg[3072];
    comm_wait_message(c, k, waiting, nwaiting, why, msg, sizeof msg);
    ust_fatal(UST_EXIT_RUNTIME, "%s", msg);
}

_Noreturn void comm_fail_timeout(const ust_comm *c, comm_kind k, const int *waiting, int nwaiting) {
    comm_fail_timeout_at(c, k, waiting, nwaiting, NULL);
}

/* "hang:" lines have one shape on every rank and backend, for scripts/ustrun to gather: the
 * group, this rank's operation (sequence number, kind) and its last completed one, and, where
 * the backend can see them, where the members it waits on are. */
void comm_timeout_report(const ust_comm *c, comm_kind k, uint64_t op, const int *waiting,
                         int nwaiting, const char *behind, char *msg, size_t cap) {
    char why[1536];
    snprintf(why, sizeof why,
             "timed out after %g s (dist.timeout_s) in op #%llu, the last completed #%llu%s%s",
             c->ctx->opts.timeout_s, (unsigned long long)op, (unsigned long long)op - 1,
             behind && *behind ? "; behind: " : "", behind ? behind : "");
    fprintf(stderr, "hang: group '%s' global rank %d waits in op #%llu (%s)%s%s\n", c->name,
            c->granks[c->rank], (unsigned long long)op, comm_kind_name(k),
            behind && *behind ? "; behind: " : "", behind ? behind : "");
    flight_on_timeout(c->ctx->fl); /* every reachable rank's ring, and the diagnosis */
    comm_wait_message(c, k, waiting, nwaiting, why, msg, cap);
}

_Noreturn void comm_fail_timeout_at(const ust_comm *c, comm_kind k, const int *waiting,
                                    int nwaiting, const char *behind) {
    char msg[3072];
    comm_timeout_report(c, k, c->done + 1, waiting, nwaiting, behind, msg, sizeof msg);
    ust_fatal(UST_EXIT_RUNTIME, "%s", msg);
}

int comm_other_members(const ust_comm *c, int *waiting, int cap) {
    int n = 0;
    for (int j = 0; j < c->size && n < cap; j++)
        if (j != c->rank) waiting[n++] = j;
    return n;
}
