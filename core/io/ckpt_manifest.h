/* ckpt_manifest: what makes a checkpoint verifiable (used by ckpt.c; tests read the format).
 * Every rank records the CRC-32 (zlib's) of each byte range it writes, cut at CKMAN_BLOCK
 * boundaries, and leaves them in the temporary step directory as .crc.<rank>; before the rename,
 * rank 0 combines them into one CRC per block of each file (and one per tensor, which only
 * names what a damaged block holds), checks that the ranks' ranges tile every file exactly, and
 * writes manifest.json (every file's size and CRCs, the job, step and layout), fsync'd. A step
 * directory without a valid manifest is never resumed from. On resume every rank verifies the
 * blocks b with b % world == rank (layout-independent: any job can verify any checkpoint), so the
 * work is spread over the ranks. */
#ifndef UST_CKPT_MANIFEST_H
#define UST_CKPT_MANIFEST_H

#include <stdint.h>

#include "error.h"

#define CKMAN_FILE "manifest.json"
#define CKMAN_FORMAT "ustrain-manifest-1"
#define CKMAN_BLOCK ((int64_t)4 << 20) /* bytes per checksum block */
#define CKMAN_MAX_FILES 8

/* One written byte range of a file (never across a block boundary, inside one tensor or the
 * header: tensor -1), and its CRC. */
typedef struct {
    int32_t file, tensor;
    uint32_t crc, pad;
    int64_t off, len;
} ckman_piece;

typedef struct {
    ckman_piece *p;
    int64_t n, cap;
    int failed; /* out of memory: the commit fails (never a manifest with holes) */
} ckman_log;

/* Records that data[0..len) of tensor `tensor` (-1: the header) was written at off of file
 * `file` (pieces that continue the last one inside its block and tensor are merged into it). */
void ckman_add(ckman_log *l, int file, int tensor, int64_t off, const void *data, int64_t len);
void ckman_free(ckman_log *l);
/* Writes the log as tmpdir/.crc.<rank>. */
int ckman_save_log(const ckman_log *l, const char *tmpdir, int rank, ust_err *e);

/* The files of a step (in the order they were declared), for rank 0's manifest. */
typedef struct {
    int n;
    const char *name[CKMAN_MAX_FILES];
    int64_t size[CKMAN_MAX_FILES];
    int ntensors[CKMAN_MAX_FILES];
} ckman_files;

/* Rank 0, after every rank's data is on disk: reads the ranks' logs from tmpdir (every .crc.<r>
 * there; it removes them), checks they cover every file of f exactly, adds state.json (read back
 * from tmpdir), and writes tmpdir/manifest.json, fsync'd, with the job, the step and the state's
 * "layout". -1 with the reason (a gap or overlap names the file and byte). */
int ckman_write(const char *tmpdir, const ckman_files *f, const char *job, int64_t step,
                const char *state_json, ust_err *e);

/* 1 when step_dir holds a manifest of the format for its step that lists model.safetensors,
 * state.json and every other file of the directory (0 when it has none, -1 with the reason when
 * it has one that is not: unreadable, not JSON, another step, a file left out, not regular). */
int ckman_valid(const char *step_dir, int64_t step, ust_err *e);

/* This rank's share of the verification of step_dir, after ckman_valid's checks (the step is
 * the directory's step_N, else state.json's): the blocks b (numbered over the files in
 * manifest order) with b % world == rank. -1 with a message naming the file, the byte range
 * and, where the header can be read, the tensors in it. */
int ckman_verify(const char *step_dir, int rank, int world, ust_err *e);

#endif
