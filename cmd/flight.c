/* ustrain flight DIR: the flight recorder's diagnosis of a hung or failed run, after the fact,
 * from the rank_R.json files every reachable rank wrote (parallel/comm/flight.h). */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "error.h"
#include "flight.h"

static const char *FLIGHT_USAGE =
    "usage: ustrain flight DIR\n"
    "  prints the flight recorder's diagnosis from DIR/flight/rank_R.json (or DIR/rank_R.json):\n"
    "  per group, the ranks that wait, on which operation and since when, and the ranks behind\n"
    "  them with the operation they never reached. The files are written into run.out_dir/flight\n"
    "  on a wait timeout, on SIGUSR2 and at a fatal error (logging.flight_entries per rank).\n";

int cmd_flight(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(FLIGHT_USAGE);
    if (argc != 1 || argv[0][0] == '-')
        return cmd_usage_error("ustrain flight", FLIGHT_USAGE, "expected one directory");
    ust_err e;
    if (flight_diagnose_dir(argv[0], stdout, &e)) {
        fprintf(stderr, "ustrain flight: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    return 0;
}
