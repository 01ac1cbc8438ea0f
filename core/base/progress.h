/* progress: of a long operation (an import, an export, a checkpoint save, a plan's search) on a
 * terminal: "WHAT 42% (1.2 of 2.9 GB)" rewritten in place on stderr at most every 0.5 s, and only
 * when stderr is a terminal and the operation has run 1 s (logs, pipes and quick operations get
 * nothing). progress_end clears the line. Units: bytes (shown in MB/GB) or plain counts. */
#ifndef UST_PROGRESS_H
#define UST_PROGRESS_H
#include <stdbool.h>

typedef struct {
    const char *what;
    double total, done, start, last; /* last: when the line was last written (0: never) */
    bool bytes, on;
} progress;

void progress_begin(progress *p, const char *what, double total, bool bytes);
void progress_update(progress *p, double done);
void progress_add(progress *p, double delta); /* done += delta */
void progress_end(progress *p);
#endif
