/* fs: the file-system helpers every reader and writer shares (checkpoints, data shards, the
 * config, metrics, the effective config): mkdir -p, and opening a file that must be a regular
 * one. A FIFO, device or directory where a file is expected is refused at once (it is opened
 * non-blocking first, so a FIFO without a writer or reader can never hang the run). */
#ifndef UST_FS_H
#define UST_FS_H

#include <stdio.h>

#include "error.h"

/* Creates dir and its missing parents (mode 0777 & ~umask). Fails, naming the path, when a
 * component cannot be created or exists and is not a directory. */
int fs_mkdir_p(const char *dir, ust_err *e);

/* open(2) of a regular file (flags as for open, O_CLOEXEC added; mode for O_CREAT): returns the
 * descriptor, in blocking mode, or -1 with a message naming the path ("not a regular file (a
 * FIFO)" for anything else). */
int fs_open_regular(const char *path, int flags, int mode, ust_err *e);

/* An exclusive, non-blocking flock on directory dir, held while *fd stays open (the kernel drops
 * it however the process ends): the guard of one writer per output directory. -1 with "WHO DIR is
 * being written by another process" when another holds it; 0 with *fd = -1 when the file system
 * has no locks. */
int fs_lock_dir(const char *dir, const char *who, int *fd, ust_err *e);

/* fopen(3) for reading a file that may also be a pipe (a config given as <(...)): opening does
 * not wait for a FIFO's writer, and a FIFO that nobody writes reads as empty; directories and
 * devices other than pipes are refused. */
FILE *fs_fopen_stream(const char *path, ust_err *e);

/* fopen(3) of a regular file for reading ("rb"), writing ("wb", truncates) or appending ("ab"). */
FILE *fs_fopen_regular(const char *path, const char *how, ust_err *e);
/* The output file a user named (what: "--dump-logits"), opened "wb" as fs_fopen_regular does,
 * at start, before any work: the message says why not (an empty path, a missing directory, a
 * directory, FIFO or device, a read-only file system, permissions). */
FILE *fs_fopen_output(const char *path, const char *what, ust_err *e);
/* The whole of regular file path, NUL-terminated (malloc'd; *len gets its length when len is not
 * NULL); NULL with a message naming the file when it cannot be read or is larger than max
 * bytes (a hostile or mistaken file costs at most that much memory). */
char *fs_read_file(const char *path, size_t max, size_t *len, ust_err *e);

/* Memory-mapped input files (data shards, checkpoint tensors) are guarded: when one shrinks
 * while it is mapped (truncated by someone else), the SIGBUS of the next read ends the process
 * with exit 1 and a message naming the file, instead of a bare "Bus error". path is copied. */
void fs_guard_mapping(const void *addr, size_t len, const char *path);
void fs_unguard_mapping(const void *addr);

/* What kind of file path is, for messages: "a FIFO", "a directory", "a character device", ... */
const char *fs_kind(unsigned mode);

#endif
