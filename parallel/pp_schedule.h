/* pp_schedule: pipeline schedules as data. pps_build turns (kind, p ranks, v chunks per rank,
 * m micro-batches, rank) into the list of actions that rank executes, in order: compute F/B/W of
 * (micro-batch, chunk) and the point-to-point transfers around them. Nothing here runs a model:
 * the lists can be printed, checked (pps_check, pps_check_pairs) and simulated with unit costs
 * (pps_simulate), and the executor walks them. Which rank holds which stage: pps_stage.
 *
 * The communication rule the executor follows and pps_simulate runs is stated at pps_costs. */
#ifndef UST_PP_SCHEDULE_H
#define UST_PP_SCHEDULE_H

#include <stdio.h>

#include "config.h"
#include "error.h"

#define PPS_MAX_P 64 /* ranks pps_simulate accepts */

typedef enum {
    PPS_F,          /* forward of (mb, chunk) */
    PPS_B,          /* backward; for zb only the input gradient (the weight gradient is W) */
    PPS_W,          /* zb: weight gradient of (mb, chunk), after its B; frees the activations */
    PPS_SEND_ACT,   /* output activation of (mb, stage) to the rank of stage+1 */
    PPS_RECV_ACT,   /* input activation of (mb, stage) from the rank of stage-1 */
    PPS_SEND_GRAD,  /* input gradient of (mb, stage) to the rank of stage-1 */
    PPS_RECV_GRAD,  /* output gradient of (mb, stage) from the rank of stage+1 */
    PPS_LOCAL_ACT,  /* dualpipev: input of (mb, stage) copied from stage-1 on this rank */
    PPS_LOCAL_GRAD, /* dualpipev: output gradient of (mb, stage) copied from stage+1 here */
} pps_op;

/* mb, chunk and stage name the LOCAL computation the action belongs to (for a receive or a
 * local copy, the one that consumes it; for a send, the one that produced it). peer: the other
 * rank, -1 for compute and local copies. split (B only): the weight gradient is left to a W of
 * its own (every B of zb, dualpipev's zero-bubble B's); otherwise B is the whole backward. */
typedef struct {
    pps_op op;
    int mb, chunk, stage, peer, split;
} pps_action;

enum {
    PPS_BREADTH_FIRST = 1, /* pps_build flag, interleaved only (default depth-first) */
    PPS_NO_SPLIT = 2, /* dualpipev, dualpipe: every B is the whole backward, no W (MoE layers and
                         full recomputation keep no deferred weight gradients) */
    PPS_FORWARD_ONLY = 4, /* pps_build_forward's: F's and their transfers, no B or W */
};

typedef struct {
    ust_pp_schedule kind;
    int p, v, m, rank, flags;
    int n;         /* actions */
    pps_action *a; /* owned, pps_free */
} pps_schedule;

/* Builds rank's schedule. Errors (-1 with a message): p, v or m < 1, rank out of range, v > 1
 * with a non-interleaved kind, interleaved with m % p != 0, dualpipev with p < 2, v != 2 or
 * m < 2p, dualpipe with p odd, v != 2, m odd or m < 2p. */
int pps_build(pps_schedule *s, ust_pp_schedule kind, int p, int v, int m, int rank, int flags,
              ust_err *e);
/* Forward only (validation), any m >= 1: each micro-batch through the stages in order, one
 * at a time, each forward with its receive before it and its send (or local copy) after it;
 * dualpipe's micro-batches all take direction 0 (stages 0 .. p-1). pps_slots gives each chunk
 * one activation set: the executor waits on every transfer batch of such a schedule (a chain has
 * nothing to overlap), so nothing is in flight when the next forward reuses the set. */
int pps_build_forward(pps_schedule *s, ust_pp_schedule kind, int p, int v, int m, int rank,
                      ust_err *e);
/* Builds all p ranks' schedules into all[0..p-1] (freed again on error). */
int pps_build_all(pps_schedule *all, ust_pp_schedule kind, int p, int v, int m, int flags,
                  ust_err *e);
void pps_free(pps_schedule *s);
/* Global stage of chunk c on rank r, and the rank holding a stage. Chunk c of rank r is global
 * stage s = c*p + r (Megatron's interleaved assignment): stage s+1 lives on rank (r+1)%p, stage
 * s-1 on (r-1+p)%p. dualpipev (v = 2) places them in a V instead: chunk 0 of rank r is stage r,
 * chunk 1 stage 2p-1-r, so micro-batches run down the ranks and back up, rank p-1 hands stage
 * p-1 to stage p locally and rank 0 holds both the first and the last stage. dualpipe (v = 2,
 * p even) keeps that numbering for two pipelines in opposite directions, each of p stages: see
 * pps_model_stage and the builder's comment in pp_schedule.c. */
int pps_stage(ust_pp_schedule kind, int p, int c, int r);
int pps_stage_rank(ust_pp_schedule kind, int p, int stage);
/* dualpipe numbers its stages as dualpipev does, 0 .. 2p-1 in a V (rank r holds r and 2p-1-r),
 * but a micro-batch runs only one arm: those of direction 0 (mb < m/2) stages 0 .. p-1, those of
 * direction 1 stages p .. 2p-1, and stage p+s is model stage s again (held by rank p-1-s).
 * pps_model_stage: the model's stage (its layers) of a schedule stage (dualpipe: stage % p,
 * else the stage); pps_stage_first / _last: the first and last stage of the micro-batches that
 * pass through stage (dualpipe: its arm; else 0 and p*v-1); pps_chunk_runs: whether chunk c of
 * rank r computes micro-batch mb (dualpipe: the chunk's direction is mb's; else always);
 * pps_chunk_last_mb: the step's last micro-batch chunk c of rank r computes. */
int pps_model_stage(ust_pp_schedule kind, int p, int stage);
int pps_stage_first(ust_pp_schedule kind, int p, int stage);
int pps_stage_last(ust_pp_schedule kind, int p, int v, int stage);
int pps_chunk_runs(ust_pp_schedule kind, int p, int m, int mb, int c, int r);
int pps_chunk_last_mb(ust_pp_schedule kind, int p, int m, int c, int r);
/* Whether the schedule has W actions (the model must keep deferred weight gradients). */
int pps_splits(const pps_schedule *s);
void pps_free_all(pps_schedule *all, int p);

const char *pps_op_name(pps_op op);
const char *pps_kind_name(ust_pp_schedule kind);
/* One line per action: "<index> F mb=3 chunk=1 stage=5" / "<index> SEND_ACT mb=3 stage=5 to=2". */
void pps_print(FILE *f, const pps_schedule *s);

/* One rank: every (mb, chunk) has exactly one F and one B (and one W exactly when its B is
 * split; split B's only in zb, where all are, and dualpipev), in dependency order (B after F, W
 * after B; with p == 1, F(c) after F(c-1) and B(c) after B(c+1)); every compute that needs a
 * remote input has exactly one matching receive before it (and after the previous compute), every
 * remote output exactly one send after it; an input from a stage on this rank (dualpipev's turn)
 * exactly one local copy after its producer and before its consumer; no other comm actions. */
int pps_check(const pps_schedule *s, ust_err *e);
/* All ranks: pps_check on each, then on every ordered pair (a, b) the k-th send from a to b and
 * the k-th receive on b from a carry the same tensor (SEND_ACT(mb, s) <-> RECV_ACT(mb, s+1),
 * SEND_GRAD(mb, s) <-> RECV_GRAD(mb, s-1)), with no send or receive left over. */
int pps_check_pairs(const pps_schedule *all, int p, ust_err *e);

/* Communication rule (what the executor must do): the comm actions standing between two compute
 * actions form ONE batch, posted together (one batched send/recv). A batch holding a receive is
 * waited on before the next compute; a batch of sends only may stay in flight while the rank
 * computes on, and is waited on before the next batch is posted (or at the end of the step). The
 * builder puts the receives of a step (one compute, or interleaved's steady F+B pair) right
 * before it and its sends right after it, so the send of one result travels in the same batch as
 * the receive for the next compute (Megatron's send_forward_recv_backward): two neighbours that
 * send to each other meet in one batch. Breadth-first interleaved posts the receives that come
 * round the ring (rank p-1 -> 0) m-p computes early, since its sender is that far behind.
 * dualpipev posts each receive in the batch of its rank that starts once the sender has posted
 * the send (found by simulating every rank with unit costs), in the sender's order, and never
 * after its consumer; its copies at the turn are LOCAL actions run on the compute stream.
 * pps_simulate runs exactly this rule and reports any deadlock. Transfers on one ordered rank
 * pair are matched in posting order (as NCCL and the shm backend do), so pps_check_pairs
 * requires the k-th send from a to b to be the k-th receive on b from a.
 * With p == 1 every neighbour stage is local: there are no comm actions.
 *
 * Unit-cost timeline. Comm is free: a batch completes when every partner has posted its side, and
 * a received tensor is there at the later of the two posts. */
typedef struct {
    double f, b, w; /* b: the whole backward for kinds without W (w unused), the input-gradient
                       part for zb and dualpipev (a B that is not split then costs b + w) */
} pps_costs;

typedef struct {
    double makespan;        /* time the last rank finishes */
    double busy[PPS_MAX_P]; /* compute time of each rank */
    double bubble;          /* max over ranks of idle/busy (Playbook: bubble time / ideal time) */
    double idle_frac;       /* max over ranks of idle/makespan */
    int peak_alive[PPS_MAX_P]; /* most (mb, chunk) activations held at once per rank: alive from
                                  the start of F to the end of B, or of W when the B is split
                                  (W still reads the layer inputs) */
} pps_sim;

/* The published bubble of the kind in the Playbook's sense (idle time over compute time, per
 * rank, comm free) for the per-chunk costs c, and its source in *formula (may be NULL):
 * afab/1f1b (p-1)/m, interleaved (p-1)/(v*m) (Narayanan et al.); zb: ZB-H1's (p-1)(F+B-2W) over
 * m(F+B) with DeepSeek-V3's B (the whole backward, here b + w); dualpipev: DeepSeek's
 * (PP/2-1)(F&B+B-3W) for PP = 2p stages on p ranks, with F&B = F + B (the overlapped pair costs
 * its sum when nothing but comm overlaps), over the 2m(F+B) each rank computes. */
double pps_analytic_bubble(ust_pp_schedule kind, int p, int v, int m, pps_costs c,
                           const char **formula);

/* Runs pps_check_pairs, then executes all p schedules under the comm rule above with start times
 * as early as dependencies allow (F(mb,s) after F(mb,s-1); B(mb,s) after F(mb,s) and
 * B(mb,s+1); W after B). A state where no rank can move is reported as a deadlock (-1, with
 * each stuck rank's action), never a hang. */
int pps_simulate(const pps_schedule *all, int p, pps_costs c, pps_sim *out, ust_err *e);
/* pps_simulate that also gives reach[r][i] (caller's arrays of all[r].n): when rank r got to
 * action i (its batch's post time for a transfer, when it was free to start a compute); the
 * dualpipev builder places receives by them. */
int pps_simulate_reach(const pps_schedule *all, int p, pps_costs c, pps_sim *out,
                       double *const *reach, ust_err *e);

/* The schedule's own bubble, without the executor's comm rule: every compute starts as soon as
 * its rank is free and its inputs are computed (transfers free and fully asynchronous, as the
 * published analyses assume). *bubble: max over ranks of idle/busy. Runs pps_check_pairs; -1 with
 * a message when the compute orders wait on each other in a cycle. */
int pps_dataflow(const pps_schedule *all, int p, pps_costs c, double *bubble, ust_err *e);

/* Activation sets: each (micro-batch, chunk) holds one of its chunk's sets from its first
 * action (a receive, a local copy or its forward) to the end of its backward (of its W when
 * split); the lowest
 * free set is taken. slot_of (may be NULL; s->n entries) gets each action's set, slots (s->v
 * entries) the number of sets each chunk needs: its peak of micro-batches in flight. */
void pps_slots(const pps_schedule *s, int *slot_of, int *slots);

#endif
