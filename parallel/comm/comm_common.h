/* comm_common: what comm.c and both backends (comm_shm.c, comm_nccl.c) share, in a file below
 * all three, so that comm.c calls the backends and no backend calls back into comm.c. It defines
 * comm.h's element sizes, operation names and bf16 rounding, and here the fatal report of a wait
 * that failed. No state. Only the comm files and the comm tests include it (via comm_impl.h). */
#ifndef UST_COMM_COMMON_H
#define UST_COMM_COMMON_H

#include "comm.h"

/* Exits with UST_EXIT_RUNTIME naming the operation, group, this rank and the members (comm-local
 * indices, printed as global ranks) it was waiting on; `why` says what happened. */
_Noreturn void comm_fail_wait(const ust_comm *c, comm_kind k, const int *waiting, int nwaiting,
                              const char *why);
/* comm_fail_wait for a wait that ran past dist.timeout_s. */
_Noreturn void comm_fail_timeout(const ust_comm *c, comm_kind k, const int *waiting, int nwaiting);
/* comm_fail_timeout naming where the members waited on are (behind: text, or NULL); also writes
 * one "hang: group 'G' global rank R waits in op #N (kind); behind: ..." line to stderr. */
_Noreturn void comm_fail_timeout_at(const ust_comm *c, comm_kind k, const int *waiting,
                                    int nwaiting, const char *behind);
/* The text comm_fail_wait exits with, into msg (capacity cap), for a thread that must end the
 * process itself (comm_nccl.c's deadline thread). */
void comm_wait_message(const ust_comm *c, comm_kind k, const int *waiting, int nwaiting,
                       const char *why, char *msg, size_t cap);
/* What comm_fail_timeout_at writes before it exits (the "hang:" line, the flight recorder's
 * timeout files), for operation number op; its message goes into msg. Does not exit. */
void comm_timeout_report(const ust_comm *c, comm_kind k, uint64_t op, const int *waiting,
                         int nwaiting, const char *behind, char *msg, size_t cap);
/* Fills waiting[] (capacity cap) with every member but this rank: whom a collective that cannot
 * tell its stragglers apart (NCCL) waits on. Returns how many. */
int comm_other_members(const ust_comm *c, int *waiting, int cap);

#endif
