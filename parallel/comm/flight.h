/* flight: the flight recorder. Each rank keeps its last N posted operations (group, kind, op and
 * collective numbers, p2p message numbers, bytes, state, times, the caller's label) in a ring and
 * writes it as DIR/rank_R.json on a wait timeout, a fatal error and SIGUSR2 (the handler only sets
 * a flag; the file is written at the next post or wait poll). flight_diagnose reads every rank's
 * file and names, per group, who waits on whom and which ranks never reached the operation they
 * wait at. Recording never fails the run: a file that cannot be written is one warning. */
#ifndef UST_FLIGHT_H
#define UST_FLIGHT_H

#include <stdio.h>

#include "error.h"

typedef struct flight flight;
typedef struct comm_ctx comm_ctx;

/* Prints the diagnosis of the newest job whose files are in dir (DIR or DIR/flight), one line
 * per waiting rank and per rank behind, and a last line naming the ranks the job waits on.
 * Returns -1 (message in e) when no file can be read. */
int flight_diagnose_dir(const char *dir, FILE *out, ust_err *e);

/* The comm layer's hooks (comm.c, comm_common.c, comm_shm_segment.c). */
flight *flight_create(comm_ctx *ctx, int entries, const char *dir);
void flight_free(flight *f);
/* A SIGUSR2 arrived: writes the file (at most every 0.2 s; a later poll writes a pending one). */
void flight_poll(flight *f);
/* A wait of this rank timed out: writes the file, asks the group members on this node to write
 * theirs (SIGUSR2), waits up to 2 s for them and, first rank of the job to get here, prints the
 * diagnosis to stderr. */
void flight_on_timeout(flight *f);

#endif
