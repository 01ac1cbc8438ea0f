/* flight internals: the ring's entry, the hooks comm.c calls as operations are posted and
 * waited on, and what the recording half (flight.c) and the reading half (flight_diag.c) share.
 * Only the comm files and the comm tests include it. */
#ifndef UST_FLIGHT_IMPL_H
#define UST_FLIGHT_IMPL_H

#include <stdint.h>

#include "comm_impl.h"
#include "flight.h"

enum { FLIGHT_POSTED, FLIGHT_WAITING, FLIGHT_DONE };

/* One p2p message of a batch: the comm-local peer, its direction, and its number among the
 * messages of that direction between the two ranks (a pair matches messages in order, so the
 * peer's matching one has the same number). */
typedef struct {
    int peer, send;
    uint64_t msg;
} flight_p2p;

/* One posted operation. coll: its number among the group's collectives (the same on every
 * member; 0 for p2p, whose op numbers differ between members). Times are log_now_s, 0 = not yet. */
typedef struct {
    int group, kind, state, np2p;
    uint64_t seq, coll, bytes;
    double t_post, t_wait, t_done;
    flight_p2p p2p[FLIGHT_P2P]; /* the first FLIGHT_P2P of a batch */
    char label[FLIGHT_LABEL];
} flight_entry;

/* comm_flight_label's: names c's next operation. */
void flight_label(ust_comm *c, const char *label);
/* Records d (its seq already assigned) and counts its collective or p2p messages on c; returns
 * the ring index (kept in the queue's desc). */
int flight_post(flight *f, ust_comm *c, const comm_desc *d, uint64_t bytes);
/* This rank starts waiting for c's operations up to seq (c->done not yet advanced); they
 * completed, from + 1 .. seq. */
void flight_wait_begin(flight *f, ust_comm *c, uint64_t seq);
void flight_wait_end(flight *f, ust_comm *c, uint64_t from, uint64_t seq);
/* Writes DIR/rank_R.json; why: "timeout", "signal", "fatal". -1 (warned once) on failure. */
int flight_write(flight *f, const char *why);

/* Files of job in dir written since wall (or, by a rank whose own wait timed out, within its
 * timeout before): how many ranks have answered. */
int flight_fresh_files(const char *dir, const char *job, double wall, int world);
/* The diagnosis of job (NULL: the newest in dir) from its files written since wall (0: any). */
int flight_diagnose_job(const char *dir, const char *job, double wall, FILE *out, ust_err *e);

#endif
