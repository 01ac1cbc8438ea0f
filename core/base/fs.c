#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_mkdir_p(const char *dir, ust_err *e) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return ust_errf(e, "%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return ust_errf(e, "cannot create directory %s: %s", buf, strerror(errno));
        struct stat st;
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
            return ust_errf(e, "cannot create directory %s: %s", buf, strerror(ENOTDIR));
        *p = c;
        if (!c) break;
    }
    return 0;
}

const char *fs_kind(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG:
        return "a regular file";
    case S_IFDIR:
        return "a directory";
    case S_IFIFO:
        return "a FIFO";
    case S_IFCHR:
        return "a character device";
    case S_IFBLK:
        return "a block device";
    case S_IFSOCK:
        return "a socket";
    default:
        return "not a regular file";
    }
}

/* Why open(2) failed, in words: an empty path, a missing directory (for a file to create), a FIFO
 * without a reader, a directory; else errno's text (a read-only file system, permissions). */
static int open_failed(const char *path, int flags, const char *want, int err, ust_err *e) {
    if (!path[0]) return ust_errf(e, "an empty path: name a file");
    if (err == ENXIO) /* a FIFO opened for writing with no reader */
        return ust_errf(e, "%s: not %s (a FIFO)", path, want);
    if (err == EISDIR) return ust_errf(e, "%s: not %s (a directory)", path, want);
    if (err == ENOENT && (flags & O_CREAT)) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) slash[slash == dir] = 0;
        return ust_errf(e, "%s: cannot create: the directory %s does not exist", path,
                        slash ? dir : ".");
    }
    return ust_errf(e, "%s: cannot open: %s", path, strerror(err));
}

/* open(2) without waiting on a FIFO (O_NONBLOCK, cleared once open), of a regular file or, with
 * pipe_ok, a pipe; what is allowed is named in the message otherwise. */
static int open_checked(const char *path, int flags, int mode, int pipe_ok, ust_err *e) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
    const char *want = pipe_ok ? "a regular file or pipe" : "a regular file";
    if (fd < 0) return open_failed(path, flags, want, errno, e);
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = ust_errf(e, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode) && !(pipe_ok && S_ISFIFO(st.st_mode)))
        rc = ust_errf(e, "%s: not %s (%s)", path, want, fs_kind(st.st_mode));
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = ust_errf(e, "%s: cannot open: %s", path, strerror(errno));
    if (rc) {
        close(fd);
        return -1;
    }
    return fd;
}

int fs_open_regular(const char *path, int flags, int mode, ust_err *e) {
    return open_checked(path, flags, mode, 0, e);
}

int fs_lock_dir(const char *dir, const char *who, int *fd, ust_err *e) {
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0) return ust_errf(e, "%s %s: %s", who, dir, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return 0;
    int err = errno;
    close(*fd);
    *fd = -1;
    if (err == EWOULDBLOCK)
        return ust_errf(e,
                        "%s %s is being written by another process (ustrain holds a lock on "
                        "it while it writes)",
                        who, dir);
    return 0; /* a file system without locks: unguarded */
}

FILE *fs_fopen_stream(const char *path, ust_err *e) {
    int fd = open_checked(path, O_RDONLY, 0, 1, e);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (fd >= 0 && !f) {
        ust_errf(e, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

FILE *fs_fopen_output(const char *path, const char *what, ust_err *e) {
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "wb", &inner);
    if (!f) ust_errf(e, "%s %s", what, inner.msg);
    return f;
}

FILE *fs_fopen_regular(const char *path, const char *how, ust_err *e) {
    int flags = how[0] == 'r'   ? O_RDONLY
                : how[0] == 'a' ? O_WRONLY | O_CREAT | O_APPEND
                                : O_WRONLY | O_CREAT | O_TRUNC;
    int fd = fs_open_regular(path, flags, 0666, e);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, how);
    if (!f) {
        ust_errf(e, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* The guarded mappings. The SIGBUS handler is their only reader and may run at any moment, so
 * the table is append-only: a new entry is written before the count that makes it visible, a
 * full table is replaced by a bigger copy (the old one is left allocated: the handler may still
 * be reading it on another thread), and a removed entry is emptied in place (end = start) for
 * the next mapping to reuse.
 * Registration itself is serialized by a mutex. This is the one piece of process-wide state in
 * the file layer, because a signal handler has no other way to find it. */
typedef struct {
    uintptr_t start, end;
    char *path;
} guarded;

typedef struct {
    int cap, n;
    guarded g[];
} guard_table;

static guard_table *g_guards;
static pthread_mutex_t g_guard_lock = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t k = write(2, s, n);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

/* "[rank R]" without snprintf, which is not async-signal-safe */
static void rank_label(char out[24]) {
    int r = ust_error_rank(), k = 0, j = 0;
    out[0] = 0;
    if (r < 0) return;
    char d[12];
    do d[k++] = (char)('0' + r % 10);
    while ((r /= 10) > 0 && k < 11);
    memcpy(out, "[rank ", 6), j = 6;
    while (k > 0) out[j++] = d[--k];
    out[j++] = ']', out[j] = 0;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    const guard_table *t = __atomic_load_n(&g_guards, __ATOMIC_ACQUIRE);
    int n = t ? __atomic_load_n(&t->n, __ATOMIC_ACQUIRE) : 0;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < n; i++) {
        uintptr_t start = t->g[i].start, end = __atomic_load_n(&t->g[i].end, __ATOMIC_ACQUIRE);
        if (a < start || a >= end) continue;
        char rank[24];
        rank_label(rank);
        say("ustrain"), say(rank), say(": error: "), say(t->g[i].path);
        say(": the file shrank while the run read it (truncated by another process?); "
            "stopping. Checkpoints already written are intact.\n");
        _exit(1);
    }
    signal(sig, SIG_DFL); /* not one of ours: the default action */
    raise(sig);
}

void fs_guard_mapping(const void *addr, size_t len, const char *path) {
    if (!addr || !len) return;
    char *p = strdup(path);
    if (!p) return; /* no guard: a truncation would end as a plain SIGBUS */
    pthread_mutex_lock(&g_guard_lock);
    guard_table *t = g_guards;
    if (!t) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
    }
    for (int i = 0; t && i < t->n; i++)
        if (t->g[i].end == t->g[i].start) { /* reuse an emptied entry; end is written last */
            free(t->g[i].path);
            t->g[i].path = p;
            t->g[i].start = (uintptr_t)addr;
            __atomic_store_n(&t->g[i].end, (uintptr_t)addr + len, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&g_guard_lock);
            return;
        }
    if (!t || t->n == t->cap) {
        int cap = t ? 2 * t->cap : 64;
        guard_table *nt = malloc(sizeof *nt + sizeof(guarded) * (size_t)cap);
        if (!nt) {
            pthread_mutex_unlock(&g_guard_lock);
            free(p);
            return;
        }
        nt->cap = cap;
        nt->n = t ? t->n : 0;
        if (t) memcpy(nt->g, t->g, sizeof(guarded) * (size_t)t->n);
        __atomic_store_n(&g_guards, nt, __ATOMIC_RELEASE);
        t = nt;
    }
    t->g[t->n] = (guarded){(uintptr_t)addr, (uintptr_t)addr + len, p};
    __atomic_store_n(&t->n, t->n + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_guard_lock);
}

void fs_unguard_mapping(const void *addr) {
    pthread_mutex_lock(&g_guard_lock);
    guard_table *t = g_guards;
    for (int i = 0; t && i < t->n; i++)
        if (t->g[i].start == (uintptr_t)addr && t->g[i].end != t->g[i].start) {
            __atomic_store_n(&t->g[i].end, t->g[i].start, __ATOMIC_RELEASE);
            break; /* the path stays: the handler may be reading it */
        }
    pthread_mutex_unlock(&g_guard_lock);
}

char *fs_read_file(const char *path, size_t max, size_t *len, ust_err *e) {
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "rb", &inner);
    if (!f) {
        ust_errf(e, "%s", inner.msg);
        return NULL;
    }
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && n <= max && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap && n <= max) {
            char *grown = realloc(buf, (cap *= 2) + 1);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad || n > max) {
        free(buf);
        if (n > max)
            ust_errf(e, "%s: larger than %zu bytes, more than such a file should hold", path, max);
        else
            ust_errf(e, "%s: cannot read: %s", path, bad ? strerror(errno) : "out of memory");
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
