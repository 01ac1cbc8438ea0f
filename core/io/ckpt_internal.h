/* ckpt_internal: what the checkpoint's own files share (ckpt_common, _write, _commit, _lock,
 * _read, _safetensors: included by those only; everyone else includes ckpt.h). The writer and
 * safetensors structs live here so the writer's commit and the reader can reach their fields;
 * the helpers are ckpt_common.c's unless noted. Every path helper fails with a message, never
 * by truncating. */
#ifndef UST_CKPT_INTERNAL_H
#define UST_CKPT_INTERNAL_H

#include <cjson/cJSON.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "progress.h"
#include "ckpt.h"
#include "ckpt_manifest.h"

#define STATE_JSON "state.json"
#define ST_META_STEP "ustrain_step" /* the step a checkpoint file was written for */
#define ST_MAX_DIMS 8
#define TMP_PREFIX ".tmp_step_"

/* snprintf into out[n]; -1 with a message when the path does not fit. */
int ckpt_pathf(char *out, size_t n, ust_err *e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* rm -rf path; 0 when path is gone (or never existed). */
int ckpt_rm_rf(const char *path);
int ckpt_fsync_dir(const char *dir, ust_err *e);
/* A test-only fault switch's value (0 when unset); the switches are listed in ckpt_common.c. */
int ckpt_fault_env(const char *name);
/* All n bytes at off, or -1 naming path (UST_FAULT_CKPT_WRITE_ERRNO makes it fail). */
int ckpt_pwrite_all(int fd, const void *buf, size_t n, int64_t off, const char *path, ust_err *e);
/* Writes a small file completely and fsyncs it (state.json, latest.tmp, failure markers). */
int ckpt_write_small_file(const char *path, const char *text, ust_err *e);
/* "step_<digits>" exactly -> the step number, else -1. */
int64_t ckpt_parse_step_name(const char *name);
/* A JSON number that is an exact non-negative integer below 2^53. */
bool ckpt_json_uint(const cJSON *j, int64_t *v);
/* ckpt_lock.c: `latest` must be a regular file when present. 1: present, 0: absent, -1: bad. */
int ckpt_check_latest(const char *dir, ust_err *e);

/* ---------------------------------------------------------------------------------------------
 * Writer (ckpt_write.c: begin, files, slices, the stage; ckpt_commit.c: the rest) */

typedef struct {
    ckpt_tensor t;
    int64_t begin; /* absolute byte offset of the tensor's data in the file */
} wtensor;

typedef struct {
    char name[CKPT_NAME_MAX];
    char path[PATH_MAX];
    int fd;
    int n;
    int64_t size; /* header and data */
    wtensor *t;
} wfile;

/* checkpoint.async: a rank's slices are copied here at the save; the writer thread writes them */
typedef struct {
    int file, tensor;
    int64_t off, len, at; /* file offset and length; where the bytes are in the buffer */
} staged_run;

struct ckpt_stage {
    unsigned char *buf;
    bool owned; /* ckpt_stage_create's buffer (freed with the stage), not a wrapped one */
    int64_t cap, used;
    staged_run *runs;
    int64_t nruns, capruns;
};

struct ckpt_writer {
    char dir[PATH_MAX], tmp[PATH_MAX], final_dir[PATH_MAX];
    int64_t step;
    int rank;
    ckpt_sync_fn sync;
    void *sync_arg;
    wfile *files;
    int nfiles;
    bool failed; /* an earlier call failed on this rank: later writes are skipped, commit fails */
    ust_err first_error; /* the reason, which commit reports (rank 0 for every rank) */
    bool slept;          /* UST_FAULT_CKPT_SLEEP_MS was applied */
    char job[72];
    ckman_log log; /* the CRC of every range this rank wrote, for the manifest */
    /* checkpoint.async */
    ckpt_stage *stage; /* NULL: synchronous */
    pthread_t thread;
    bool thread_started;
    atomic_int thread_done;
    int thread_rc;
    ust_err thread_err;
    char *state_json; /* rank 0: what the thread writes as state.json */
    int keep_last;
    double *times; /* ckpt_set_times: where the writer's start and end go, or NULL */
    progress prog; /* rank 0's synchronous writes on a terminal (started by the first slice) */
};

/* ckpt_write.c. Errors are sticky: the first is kept, later writes are skipped; returns -1. */
int ckpt_writer_fail(ckpt_writer *w, const ust_err *e);
/* A barrier that also tells every rank whether any of them failed. */
bool ckpt_writer_sync(ckpt_writer *w, bool failed);
/* UST_FAULT_CKPT_SLEEP_MS, once per checkpoint, after the rank's first slice is written. */
void ckpt_fault_sleep(ckpt_writer *w);
/* ckpt_commit.c: this rank's files closed and fsync'd (and state.json on rank 0), then, all
 * ranks together, the manifest and the publication; ckpt_finish_global frees w. */
int ckpt_finish_local(ckpt_writer *w, const char *state_json, ust_err *e);
int ckpt_finish_global(ckpt_writer *w, int rc, const char *state_json, int keep_last, ust_err *e);

/* ---------------------------------------------------------------------------------------------
 * safetensors (ckpt_safetensors.c); the reader looks entries up by name */

typedef struct {
    char *name;
    char dtype[16];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t begin, end; /* relative to the data start */
} st_entry;

struct st_file {
    char *path;
    void *map;
    size_t size;
    const unsigned char *data; /* start of the tensor data */
    int64_t data_len;
    int64_t meta_step; /* __metadata__'s ustrain_step, -1 when absent */
    int n;
    st_entry *e;  /* in header order */
    int *by_name; /* indices sorted by name, for lookup */
};

/* The entry named name, or NULL. */
const st_entry *st_find(const st_file *f, const char *name);

#endif
