/* ckpt_commit: the end of a save (sync or async): every rank's files closed, the manifest that
 * seals the step, the atomic rename into place, `latest`, pruning; or nothing published. */
#include "ckpt_internal.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void free_writer(ckpt_writer *w) {
    if (w->thread_started) pthread_join(w->thread, NULL);
    ckman_free(&w->log);
    free(w->state_json);
    for (int i = 0; i < w->nfiles; i++) {
        if (w->files[i].fd >= 0) close(w->files[i].fd);
        free(w->files[i].t);
    }
    free(w->files);
    free(w);
}

/* Keeps the newest keep_last checkpoints, counting the one just written; older step_N go.
 * Steps above the one just written are left alone: they are not older. */
static void prune(const ckpt_writer *w, int keep_last) {
    if (keep_last <= 0) return;
    DIR *d = opendir(w->dir);
    if (!d) return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = ckpt_parse_step_name(de->d_name);
        if (s < 0 || s >= w->step) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *ns = realloc(steps, sizeof(int64_t) * (size_t)cap);
            if (!ns) break;
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    /* descending: the first keep_last - 1 older ones stay */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t tmp = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = tmp;
        }
    for (int i = keep_last - 1; i < n; i++) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/step_%lld", w->dir, (long long)steps[i]) >= (int)sizeof p)
            continue;
        if (ckpt_rm_rf(p) != 0)
            fprintf(stderr, "ustrain: warning: checkpoint: cannot remove old %s: %s\n", p,
                    strerror(errno));
    }
    free(steps);
}

/* Rank 0, after every rank's data is on disk: make step_N appear atomically, then `latest`. */
static int publish(ckpt_writer *w, int keep_last, ust_err *e) {
    if (ckpt_fsync_dir(w->tmp, e)) return -1;
    struct stat st;
    char old[PATH_MAX];
    bool replacing = lstat(w->final_dir, &st) == 0;
    if (replacing) {
        /* step_N exists (a rerun of the same step): move it aside first, so there is never a
         * moment with two directories or a half-removed one under the final name */
        if (ckpt_pathf(old, sizeof old, e, "%s/.old_step_%lld", w->dir, (long long)w->step))
            return -1;
        if (ckpt_rm_rf(old) != 0)
            return ust_errf(e, "checkpoint: cannot remove %s: %s", old, strerror(errno));
        if (rename(w->final_dir, old) != 0)
            return ust_errf(e, "checkpoint: cannot move %s aside: %s", w->final_dir,
                            strerror(errno));
    }
    if (rename(w->tmp, w->final_dir) != 0) {
        int err = errno;
        if (replacing) rename(old, w->final_dir);
        return ust_errf(e, "checkpoint: cannot rename %s to %s: %s", w->tmp, w->final_dir,
                        strerror(err));
    }
    if (replacing) ckpt_rm_rf(old);
    if (ckpt_fsync_dir(w->dir, e)) return -1;

    char latest[PATH_MAX], latest_tmp[PATH_MAX], text[64];
    if (ckpt_pathf(latest, sizeof latest, e, "%s/latest", w->dir)) return -1;
    if (ckpt_pathf(latest_tmp, sizeof latest_tmp, e, "%s/latest.tmp", w->dir)) return -1;
    snprintf(text, sizeof text, "step_%lld\n", (long long)w->step);
    if (ckpt_write_small_file(latest_tmp, text, e)) return -1;
    if (rename(latest_tmp, latest) != 0)
        return ust_errf(e, "checkpoint: cannot rename %s to %s: %s", latest_tmp, latest,
                        strerror(errno));
    if (ckpt_fsync_dir(w->dir, e)) return -1;
    prune(w, keep_last);
    return 0;
}

/* Every rank once its data is written: rank 0 writes state.json, each rank leaves the CRCs of
 * what it wrote (.crc.<rank>) and fsyncs and closes its files. */
int ckpt_finish_local(ckpt_writer *w, const char *state_json, ust_err *e) {
    int rc = 0;
    if (w->failed) {
        *e = w->first_error;
        rc = -1;
    }
    char p[PATH_MAX];
    if (!rc && w->rank == 0) {
        rc = ckpt_pathf(p, sizeof p, e, "%s/%s", w->tmp, STATE_JSON);
        if (!rc) rc = ckpt_write_small_file(p, state_json ? state_json : "{}\n", e);
    }
    if (!rc) rc = ckman_save_log(&w->log, w->tmp, w->rank, e);
    for (int i = 0; i < w->nfiles; i++) {
        wfile *f = &w->files[i];
        if (f->fd < 0) continue;
        if (!rc && fsync(f->fd) != 0)
            rc = ust_errf(e, "checkpoint: cannot fsync %s: %s", f->path, strerror(errno));
        if (close(f->fd) != 0 && !rc)
            rc = ust_errf(e, "checkpoint: cannot write %s: %s", f->path, strerror(errno));
        f->fd = -1;
    }
    return rc;
}

/* Rank 0: manifest.json from every rank's CRCs (which must tile the files exactly). */
static int write_manifest(const ckpt_writer *w, const char *state_json, ust_err *e) {
    ckman_files f = {.n = w->nfiles};
    if (w->nfiles > CKMAN_MAX_FILES)
        return ust_errf(e, "checkpoint: %d files, at most %d", w->nfiles, CKMAN_MAX_FILES);
    for (int i = 0; i < w->nfiles; i++) {
        f.name[i] = w->files[i].name;
        f.size[i] = w->files[i].size;
        f.ntensors[i] = w->files[i].n;
    }
    return ckman_write(w->tmp, &f, w->job, w->step, state_json, e);
}

/* Every rank together, after ckpt_finish_local (rc: its result): the manifest and the publication,
 * or nothing published when any rank failed. Frees w. */
int ckpt_finish_global(ckpt_writer *w, int rc, const char *state_json, int keep_last, ust_err *e) {
    /* every rank learns whether any failed, and rank 0 the first failed rank's reason: it must
     * never publish another rank's holes, and says why it did not */
    char why[sizeof e->msg];
    snprintf(why, sizeof why, "%s", rc ? e->msg : "");
    int failed_rank = w->sync ? w->sync(w->sync_arg, rc != 0, why, sizeof why) : (rc ? 0 : -1);
    bool any = failed_rank >= 0;
    if (w->rank == 0) {
        if (!rc && any)
            rc = ust_errf(e, "rank %d failed to write its part: %s", failed_rank,
                          why[0] ? why : "(see its own message)");
        if (!rc) rc = write_manifest(w, state_json, e);
        if (!rc) rc = publish(w, keep_last, e);
        if (rc) ckpt_rm_rf(w->tmp);
    }
    bool published = !ckpt_writer_sync(w, rc != 0 && w->rank == 0) && !any;
    if (!rc && w->rank != 0 && !published)
        rc = ust_errf(e, "checkpoint %s: rank 0 did not finish the commit (see its message)",
                      w->final_dir);
    free_writer(w);
    return rc;
}

int ckpt_commit(ckpt_writer *w, const char *state_json, int keep_last, ust_err *e) {
    progress_end(&w->prog);
    if (w->stage) return ckpt_commit_async(w, state_json, keep_last, e) || ckpt_poll(w, 1, e);
    int rc = ckpt_finish_local(w, state_json, e);
    return ckpt_finish_global(w, rc, state_json, keep_last, e);
}

/* ---------------------------------------------------------------------------------------------
 * checkpoint.async: the writer thread and the collective poll */

/* The background writer: the staged runs to their files (with their CRCs), then ckpt_finish_local.
 */
static void *writer_thread(void *arg) {
    ckpt_writer *w = arg;
    if (w->times) w->times[0] = log_now_s();
    const ckpt_stage *s = w->stage;
    ust_err e = w->first_error;
    int rc = w->failed ? -1 : 0;
    for (int64_t i = 0; !rc && i < s->nruns; i++) {
        const staged_run *r = &s->runs[i];
        const wfile *f = &w->files[r->file];
        rc = ckpt_pwrite_all(f->fd, s->buf + r->at, (size_t)r->len, r->off, f->path, &e);
        if (!rc) ckman_add(&w->log, r->file, r->tensor, r->off, s->buf + r->at, r->len);
        if (!rc) ckpt_fault_sleep(w);
    }
    if (rc) ckpt_writer_fail(w, &e);
    rc = ckpt_finish_local(w, w->state_json, &e);
    w->thread_err = e;
    w->thread_rc = rc;
    if (w->times) w->times[1] = log_now_s(); /* seen by the poll that sees thread_done */
    atomic_store(&w->thread_done, 1);
    return NULL;
}

int ckpt_commit_async(ckpt_writer *w, const char *state_json, int keep_last, ust_err *e) {
    (void)e;
    w->keep_last = keep_last;
    if (state_json && !(w->state_json = strdup(state_json))) {
        ust_err oom;
        ust_errf(&oom, "checkpoint: out of memory");
        ckpt_writer_fail(w, &oom);
    }
    if (!w->stage) { /* nothing staged: the writes were made already */
        w->thread_rc = ckpt_finish_local(w, w->state_json, &w->thread_err);
        atomic_store(&w->thread_done, 1);
        return 0;
    }
    if (pthread_create(&w->thread, NULL, writer_thread, w) == 0)
        w->thread_started = true;
    else
        writer_thread(w); /* no thread to be had: write now */
    return 0;
}

void ckpt_set_times(ckpt_writer *w, double *times) { w->times = times; }

int ckpt_poll(ckpt_writer *w, int block, ust_err *e) {
    if (block && w->thread_started) {
        pthread_join(w->thread, NULL);
        w->thread_started = false;
    }
    int done = atomic_load(&w->thread_done);
    bool waiting = w->sync ? w->sync(w->sync_arg, !done, NULL, 0) >= 0 : !done;
    if (waiting) return 1;
    if (w->thread_started) {
        pthread_join(w->thread, NULL);
        w->thread_started = false;
    }
    if (w->thread_rc) *e = w->thread_err;
    return ckpt_finish_global(w, w->thread_rc, w->state_json, w->keep_last, e) ? -1 : 0;
}

void ckpt_abort(ckpt_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->nfiles; i++)
        if (w->files[i].fd >= 0) {
            close(w->files[i].fd);
            w->files[i].fd = -1;
        }
    if (w->rank == 0)
        ckpt_rm_rf(w->tmp); /* only the temporary directory: step_* stay as they are */
    free_writer(w);
}
