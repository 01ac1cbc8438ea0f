/* ckpt: checkpoints as safetensors with whole tensors under canonical names.
 * <dir>/step_<N>/{model.safetensors, optimizer.safetensors, state.json}. Every rank computes the
 * same file layout from the same tensor list; rank 0 writes the headers, every rank pwrites the
 * slice it holds (a box of the 2D view, then a flat range inside it: covers TP, PP, EP and ZeRO
 * shards). The step is written under a temporary name, fsync'd, sealed by a manifest.json of
 * every file's size and block CRCs (ckpt_manifest.h), renamed, and `latest` updated atomically,
 * so a crash mid-write never damages the previous checkpoint; keep_last prunes. Only a step with
 * a valid manifest counts as finished, and ckpt_verify checks its bytes against it. One job at a
 * time (ckpt_lock_dir); checkpoint.async writes from a thread (ckpt_commit_async, ckpt_poll).
 * Readers check every tensor's name, shape and place in the file and name the one that differs. */
#ifndef UST_CKPT_H
#define UST_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "error.h"

#define CKPT_NAME_MAX 128

typedef struct {
    char name[CKPT_NAME_MAX];
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* the whole tensor's shape */
} ckpt_tensor;

/* The part of a tensor a rank holds. For a 1-D tensor of n use rows = 1, cols = n. The rank's
 * data is the row-major box [row0, row0+nrows) x [col0, col0+ncols) of the 2-D view, restricted
 * to its flat elements [flat0, flat1) in box order. */
typedef struct {
    int64_t row0, nrows, col0, ncols;
    int64_t flat0, flat1;
} ckpt_slice;

ckpt_slice ckpt_whole(const ckpt_tensor *t);
/* -1 with a message naming tensor name when s is not a box of its rows x cols 2-D view (every
 * bound checked in 64 bits). */
int ckpt_check_slice(const ckpt_slice *s, int64_t rows, int64_t cols, const char *name, ust_err *e);
/* Calls fn(element index in the whole tensor, index in the slice, count) for each contiguous run
 * of slice s of a tensor of cols columns: one per box row, or one when the box spans whole rows. */
typedef int (*ckpt_run_fn)(void *ctx, int64_t elem, int64_t slice_elem, int64_t n, ust_err *e);
int ckpt_for_each_run(const ckpt_slice *s, int64_t cols, ckpt_run_fn fn, void *ctx, ust_err *e);
/* "[a, b]" for messages. */
void ckpt_format_shape(char *out, size_t n, int ndim, const int64_t *shape);

/* The job's exclusive lock on dir (rank 0 takes it once, before anything is read or written;
 * the kernel drops it when the process ends). Creates dir, refuses a second job with exit-2
 * material naming the holder (host, pid, start time) and checks that `latest` is a regular file
 * when present; it writes nothing into an existing directory. ckpt_lock_claim, once the run is
 * sure to start, records the holder in .lock and removes temporary step directories that dead
 * jobs left. */
typedef struct {
    int fd;
    char dir[4096]; /* "" when not locked */
} ckpt_lock;
int ckpt_lock_dir(const char *dir, ckpt_lock *l, ust_err *e);
void ckpt_lock_claim(ckpt_lock *l);
/* -1 with a message starting with `what` when path (existing or to be made) is a checkpoint's
 * step directory or lies inside one (a step_<N> holding state.json or manifest.json, found
 * through the resolved path and its parents): a step's files are sealed by its manifest and
 * pruning removes the whole directory, so nothing else is ever written there. */
int ckpt_refuse_in_step(const char *path, const char *what, ust_err *e);
/* The same for a file to be written (metrics, logits, a plan): not inside a step, and not a
 * checkpoint directory's `latest` or .lock. */
int ckpt_refuse_output(const char *file, const char *what, ust_err *e);
void ckpt_unlock_dir(ckpt_lock *l);

typedef struct ckpt_writer ckpt_writer;
/* A barrier that tells every rank whether any failed: returns the lowest failed rank (-1: none)
 * and, when msg is given (cap bytes: this rank's reason on the way in), that rank's reason. */
typedef int (*ckpt_sync_fn)(void *arg, int failed, char *msg, size_t cap);

/* Starts step `step` under dir (creates dir and the temporary step directory
 * .tmp_step_<N>.<job>; job, the same on every rank, may be NULL). All ranks call it; sync (NULL
 * for one rank) synchronizes them where the protocol needs it. Errors are sticky: after one,
 * later calls do nothing and fail, and ckpt_commit reports the first (rank 0 quotes a failed
 * rank's reason), so every rank always reaches the commit. */
ckpt_writer *ckpt_begin(const char *dir, int64_t step, int rank, const char *job, ckpt_sync_fn sync,
                        void *sync_arg, ust_err *e);
/* Declares a file (e.g. "model.safetensors") with its tensors in order; returns its index. */
int ckpt_add_file(ckpt_writer *w, const char *file, const ckpt_tensor *tensors, int n, ust_err *e);
int ckpt_write_slice(ckpt_writer *w, int file, const char *name, const ckpt_slice *s,
                     const float *host_data, ust_err *e);
/* Rank 0 writes state.json (may be NULL on others). Then fsync, sync, rename to step_<N>,
 * update `latest`, prune to keep_last (0 = keep all). A failure anywhere removes the temporary
 * directory and publishes nothing. Frees w. */
int ckpt_commit(ckpt_writer *w, const char *state_json, int keep_last, ust_err *e);
void ckpt_abort(ckpt_writer *w); /* leaves the previous checkpoints untouched */

/* checkpoint.async. A stage is the host buffer a rank's slices are copied into (sized once, by
 * the caller, for everything the rank writes; a save that needs more fails). With a stage set
 * (before the first ckpt_add_file), ckpt_write_slice copies, and ckpt_commit_async starts the
 * writer thread (the writes, the CRCs, state.json on rank 0, fsync) and returns at once: the
 * caller goes on training and must not touch the stage until the save completes. ckpt_poll is
 * collective (every rank at the same points): block 0 returns 1 while any rank's thread runs;
 * otherwise (and always with block 1, after waiting) it finishes the commit as ckpt_commit does
 * (the manifest, the rename, `latest`, pruning), frees w and returns 0 or -1. ckpt_commit on a
 * staged writer is commit_async + a blocking poll. */
typedef struct ckpt_stage ckpt_stage;
ckpt_stage *ckpt_stage_create(int64_t bytes, ust_err *e);
/* A stage over the caller's buffer of bytes (e.g. page-locked memory); the caller frees it after
 * ckpt_stage_free. */
ckpt_stage *ckpt_stage_wrap(void *buf, int64_t bytes, ust_err *e);
void ckpt_stage_free(ckpt_stage *s);
int64_t ckpt_stage_bytes(const ckpt_stage *s);
void ckpt_set_stage(ckpt_writer *w, ckpt_stage *s);
/* The stage's space for slice s (one copy instead of two): *out gets where its elements go, in
 * slice order, for the caller to fill before the commit; NULL (and 0) without a stage. */
int ckpt_stage_reserve(ckpt_writer *w, int file, const char *name, const ckpt_slice *s, float **out,
                       ust_err *e);
int ckpt_commit_async(ckpt_writer *w, const char *state_json, int keep_last, ust_err *e);
int ckpt_poll(ckpt_writer *w, int block, ust_err *e);
/* The writer's start and end (log_now_s) go to times[0..1], the caller's memory, which must
 * outlive the save; read them once ckpt_poll has completed it (logging.trace's async span). */
void ckpt_set_times(ckpt_writer *w, double *times);

typedef struct ckpt_reader ckpt_reader;

/* Finds the newest finished checkpoint in dir (a step_N with state.json and a valid manifest):
 * writes its step directory into out and returns 1; returns 0 when there is none; -1 on error.
 * _before: the newest finished one below step `below` (the fallback after a failed verify). */
int ckpt_find_latest(const char *dir, char *out, int out_size, ust_err *e);
/* The step a directory's name says (step_<N>), or -1 for any other name. */
int64_t ckpt_dir_step(const char *dir);
int ckpt_find_latest_before(const char *dir, int64_t below, char *out, int out_size, ust_err *e);
/* Collective over the job's ranks (sync as for the writer; NULL for one rank): each verifies
 * its share of step_dir's blocks against the manifest. 0, or -1 on every rank with the first
 * failed rank's reason (naming the file, the bytes and the tensors). */
int ckpt_verify(const char *step_dir, int rank, int world, ckpt_sync_fn sync, void *sync_arg,
                ust_err *e);
ckpt_reader *ckpt_open(const char *step_dir, ust_err *e);
void ckpt_close(ckpt_reader *r);
/* Reads the slice of tensor `name` in file (e.g. "model.safetensors"); fails with a message
 * naming the tensor when it is missing or its shape differs from `expect`. */
int ckpt_read_slice(ckpt_reader *r, const char *file, const ckpt_tensor *expect,
                    const ckpt_slice *s, float *host_out, ust_err *e);
const char *ckpt_state_json(const ckpt_reader *r); /* contents of state.json */
/* -1 naming them when file holds tensors not among want[0..n) (a checkpoint of a larger or
 * otherwise different model than the one configured: reading only what the model has would go
 * on silently as another model). */
int ckpt_check_unused(ckpt_reader *r, const char *file, const ckpt_tensor *want, int n, ust_err *e);

/* The run position state.json carries (written by the trainer with the layout and config).
 * batch_since: since which step (and sample) the global batch has been batch_size sequences,
 * so sample_index = batch_since_sample + (step - batch_since_step) x batch_size. */
typedef struct {
    int64_t step, sample_index;                               /* steps done, samples consumed */
    int64_t batch_since_step, batch_since_sample, batch_size; /* batch_size 0: not recorded */
    double loss;                                              /* NaN when absent */
} ckpt_state;
/* Parses state.json text of step directory dir: step and sample_index must be non-negative
 * integers, step must be the one dir's name (step_<N>) says, and sample_index what batch_since
 * implies when it is recorded; -1 with a message naming the values otherwise. */
int ckpt_parse_state(const char *json, const char *dir, ckpt_state *out, ust_err *e);

/* What the tools read of a finished checkpoint; `who` (e.g. "export") starts the messages.
 * ckpt_resolve_step: path as given when it is a step directory (it holds state.json), else the
 * newest finished step of the checkpoint directory path; either verified against its manifest
 * (ckpt_verify, one process): a named step must verify, a directory falls back to older steps
 * with a warning. -1 when it is neither, or nothing verifies.
 * ckpt_load_config: the effective config the step was trained with (state.json's "config", YAML
 * text), loaded over the defaults and validated (world size unchecked). */
int ckpt_resolve_step(const char *path, const char *who, char *out, int n, ust_err *e);
int ckpt_load_config(const char *step, const char *who, ust_config *c, ust_err *e);

/* Minimal safetensors access used by the readers above and by tests/tools. */
typedef struct st_file st_file;
st_file *st_open(const char *path, ust_err *e);
void st_close(st_file *f);
int st_count(const st_file *f);
const char *st_name(const st_file *f, int i);
/* Returns pointer to fp32 data of tensor name (mmap'd), shape out; NULL if missing. */
const float *st_tensor(const st_file *f, const char *name, int *ndim, int64_t shape[4]);
/* Any dtype: the tensor's bytes in the mapping (any alignment), its dtype ("F32", "BF16", ...),
 * element size and shape (at most 4 dims); -1 if missing or of more dims. */
typedef struct {
    const unsigned char *data;
    const char *dtype;
    int esize, ndim;
    int64_t shape[4];
} st_view;
int st_raw(const st_file *f, const char *name, st_view *v);
const char *st_path(const st_file *f);
/* -1 naming both when f's __metadata__ says it was written for another step than state_json's
 * (a file moved or copied between step directories); 0 when they agree or either is unknown. */
int st_check_step(const st_file *f, const char *state_json, const char *dir, const char *file,
                  ust_err *e);

#endif
