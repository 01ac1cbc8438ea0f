/* ckpt_lock: one job per checkpoint directory (its flock), and the refusals to write into a
 * checkpoint's step, `latest` or .lock. */
#include "ckpt_internal.h"
#include "ckpt_manifest.h"
#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOCK_FILE ".lock"

/* `latest` must be a regular file when it exists: a directory, FIFO or device there would hang
 * the resume or fail only at the next save, after training. 1: present, 0: absent, -1: bad. */
int ckpt_check_latest(const char *dir, ust_err *e) {
    char p[PATH_MAX];
    struct stat st;
    if (ckpt_pathf(p, sizeof p, e, "%s/latest", dir)) return -1;
    if (stat(p, &st) != 0) return errno == ENOENT ? 0 : ust_errf(e, "%s: %s", p, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ust_errf(e,
                        "checkpoint %s: latest is %s, not the file naming the newest checkpoint "
                        "(remove it; the next save writes it)",
                        dir, fs_kind(st.st_mode));
    return 1;
}

static bool has_entry(const char *dir, const char *name) {
    char p[PATH_MAX + 32];
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && access(p, F_OK) == 0;
}

/* The nearest existing directory of path (path itself when it exists), resolved into real;
 * *is_path: whether that is path. 0, or -1 when not even "." resolves. */
static int nearest_existing(const char *path, char *real, bool *is_path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    *is_path = true;
    while (!realpath(p, real)) {
        char *slash = strrchr(p, '/');
        if (!slash)
            snprintf(p, sizeof p, ".");
        else if (slash == p)
            snprintf(p, sizeof p, "/");
        else
            *slash = 0;
        *is_path = false;
        if ((!strcmp(p, ".") || !strcmp(p, "/")) && !realpath(p, real)) return -1;
        if (!strcmp(p, ".") || !strcmp(p, "/")) break;
    }
    return 0;
}

int ckpt_refuse_in_step(const char *path, const char *what, ust_err *e) {
    char real[PATH_MAX];
    bool at_path;
    if (nearest_existing(path, real, &at_path)) return 0;
    for (;; at_path = false) {
        if (ckpt_dir_step(real) >= 0 &&
            (has_entry(real, "state.json") || has_entry(real, CKMAN_FILE)))
            return ust_errf(e,
                            "%s %s is %s ustrain checkpoint step %s: writing there would damage "
                            "the checkpoint (or be pruned with it); use a directory of its own",
                            what, path, at_path ? "the" : "inside the", real);
        char *slash = strrchr(real, '/');
        if (!slash || slash == real) return 0;
        *slash = 0;
    }
}

int ckpt_refuse_output(const char *file, const char *what, ust_err *e) {
    if (ckpt_refuse_in_step(file, what, e)) return -1;
    char dir[PATH_MAX];
    const char *slash = strrchr(file, '/'), *base = slash ? slash + 1 : file;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - file) + (slash == file) : 1,
             slash ? file : ".");
    if ((!strcmp(base, "latest") || !strcmp(base, LOCK_FILE)) &&
        (has_entry(dir, "latest") || has_entry(dir, LOCK_FILE)))
        return ust_errf(e,
                        "%s %s is a ustrain checkpoint directory's %s: writing it would damage "
                        "the checkpoints; use a file of its own",
                        what, file, base);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The job's lock on the checkpoint directory. flock is released by the kernel when the holder
 * dies, however it dies, so a crashed job never blocks the next one; the file itself stays and
 * names the last holder. */

static void describe_holder(char *out, size_t n) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    char when[64] = "?";
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %z", &tm);
    snprintf(out, n, "host %s, pid %ld, started %s\n", host, (long)getpid(), when);
}

/* Temporary step directories of earlier jobs: nobody else can be writing them while we hold
 * the lock (.old_step_N is left alone: it may be the only copy of a step being replaced). */
static void remove_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[PATH_MAX];
        if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) ||
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p)
            continue;
        if (ckpt_rm_rf(p) != 0)
            fprintf(stderr, "ustrain: warning: checkpoint: cannot remove stale %s: %s\n", p,
                    strerror(errno));
    }
    if (d) closedir(d);
}

int ckpt_lock_dir(const char *dir, ckpt_lock *l, ust_err *e) {
    l->fd = -1;
    l->dir[0] = 0;
    char p[PATH_MAX];
    ust_err inner;
    if (ckpt_refuse_in_step(dir, "checkpoint.dir", e) || fs_mkdir_p(dir, e) ||
        ckpt_pathf(p, sizeof p, e, "%s/" LOCK_FILE, dir))
        return -1;
    int fd = fs_open_regular(p, O_RDWR | O_CREAT, 0644, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint.dir %s: cannot lock: %s", dir, inner.msg);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[512] = "";
        ssize_t k = err == EWOULDBLOCK ? pread(fd, holder, sizeof holder - 1, 0) : -1;
        holder[k > 0 ? k : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        if (err == EWOULDBLOCK)
            return ust_errf(e,
                            "checkpoint.dir %s is in use by another job (%s; lock file %s): two "
                            "jobs must not share a checkpoint directory",
                            dir, holder[0] ? holder : "holder not yet recorded", p);
        if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS)
            return ust_errf(e, "checkpoint.dir %s: cannot lock %s: %s", dir, p, strerror(err));
        fprintf(stderr,
                "ustrain: warning: checkpoint.dir %s: the file system does not support locks "
                "(%s); nothing stops a second job from using the same directory\n",
                dir, strerror(err));
        fd = -1;
    }
    l->fd = fd;
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    if (ckpt_check_latest(dir, e) < 0) {
        ckpt_unlock_dir(l);
        return -1;
    }
    return 0;
}

/* Only now, when the run is sure to start, is anything written: a refused run leaves .lock (and
 * the stale temporaries) as they were. */
void ckpt_lock_claim(ckpt_lock *l) {
    if (!l->dir[0]) return;
    if (l->fd >= 0) {
        char text[512];
        describe_holder(text, sizeof text);
        if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, text, strlen(text), 0) < 0)
            fprintf(stderr, "ustrain: warning: cannot record the holder in %s/" LOCK_FILE ": %s\n",
                    l->dir, strerror(errno));
    }
    remove_stale_tmp(l->dir);
}

void ckpt_unlock_dir(ckpt_lock *l) {
    if (l->fd >= 0) close(l->fd); /* closing the last descriptor releases the flock */
    l->fd = -1;
    l->dir[0] = 0;
}
