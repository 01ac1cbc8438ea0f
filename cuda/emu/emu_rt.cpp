/* emu_rt: the emulated CUDA runtime and NCCL (contract in emu_rt.h). Test infrastructure for the
 * emulator build only; compiled with g++ by `make emu`, never into the normal build. */
#include "emu_rt.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

static void emu_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    void *bt[32];
    backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
    abort();
}

/* ================================================================ coroutine switch
 * emu_cuda.h's GPU threads switch stacks with this (x86-64 SysV: rbp, rbx, r12-r15 are the
 * callee-saved registers; the stack pointer is saved in *save_sp, then loaded from load_sp). */
#if defined(__x86_64__)
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

/* ================================================================ device memory
 * One memfd mapped twice: `base` is what device pointers point into (PROT_NONE unless a kernel
 * or GEMM runs), `alias` is always readable and writable and is what the emulator itself (copies,
 * NCCL on the streams' threads) uses. Allocation is first-fit over the heap. */
namespace {
struct Heap {
    std::mutex mu;
    char *base = nullptr, *alias = nullptr;
    size_t cap = 0, top = 0; /* top: high-water mark of the allocations, page-rounded */
    size_t used = 0;
    std::map<size_t, size_t> free_;                       /* offset -> bytes */
    std::map<size_t, std::pair<size_t, size_t>> live; /* offset -> (asked, reserved) bytes */
    int open_depth = 0;
    bool guard = true;
};
Heap heap;
const size_t kPage = 4096;

void heap_protect_locked(int prot) {
    if (heap.guard && heap.top && mprotect(heap.base, heap.top, prot))
        emu_die("mprotect of the device heap failed");
}

void on_segv(int sig, siginfo_t *si, void *) {
    char *a = (char *)si->si_addr;
    if (heap.base && a >= heap.base && a < heap.base + heap.cap) {
        char msg[160];
        int n = snprintf(msg, sizeof msg,
                         "emu: host code touched device memory at %p (device heap offset %zu); "
                         "device pointers are only for kernels, cuBLAS, copies and NCCL\n",
                         (void *)a, (size_t)(a - heap.base));
        if (write(2, msg, n) < 0) {}
        void *bt[32];
        backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void heap_init_locked() {
    if (heap.base) return;
    const char *mb = getenv("EMU_DEVICE_MB");
    heap.cap = (size_t)(mb ? atol(mb) : 4096) << 20;
    const char *g = getenv("EMU_GUARD");
    heap.guard = !(g && !strcmp(g, "0"));
    int fd = memfd_create("emu-device-memory", 0);
    if (fd < 0 || ftruncate(fd, (off_t)heap.cap)) emu_die("cannot create the device heap");
    heap.base = (char *)mmap(nullptr, heap.cap, heap.guard ? PROT_NONE : PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_NORESERVE, fd, 0);
    heap.alias = (char *)mmap(nullptr, heap.cap, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (heap.base == MAP_FAILED || heap.alias == MAP_FAILED) emu_die("cannot map the device heap");
    heap.free_[0] = heap.cap;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, nullptr);
}

bool in_heap(const void *p) {
    const char *c = (const char *)p;
    return heap.base && c >= heap.base && c < heap.base + heap.cap;
}

/* The always-accessible address of [p, p + n) of device memory; dies naming `what` when p is
 * not device memory or the range runs past its allocation. */
char *dev_alias(const void *p, size_t n, const char *what) {
    if (!n) return (char *)p;
    if (!in_heap(p)) emu_die("%s: %p is not device memory", what, p);
    size_t off = (size_t)((const char *)p - heap.base);
    std::lock_guard<std::mutex> l(heap.mu);
    auto it = heap.live.upper_bound(off);
    if (it == heap.live.begin()) emu_die("%s: %p is not in a live allocation", what, p);
    --it;
    /* the bytes asked for, not the rounded reservation: an overrun real CUDA would not notice
     * until it hits a neighbour is caught at once */
    if (off + n > it->first + it->second.first)
        emu_die("%s: %zu bytes at %p run %zu bytes past their allocation", what, n, p,
                off + n - (it->first + it->second.first));
    return heap.alias + off;
}
} // namespace

extern "C" void emu_check_kernel_pointer(const char *kernel, const char *host_fn, int arg,
                                         const void *p) {
    if (p && !in_heap(p))
        emu_die("kernel %s launched by %s: argument %d (%p) is host memory, not device memory",
                kernel, host_fn, arg + 1, p);
}

extern "C" void emu_dev_open(void) {
    std::lock_guard<std::mutex> l(heap.mu);
    if (heap.open_depth++ == 0) heap_protect_locked(PROT_READ | PROT_WRITE);
}

extern "C" void emu_dev_close(void) {
    std::lock_guard<std::mutex> l(heap.mu);
    if (--heap.open_depth == 0) heap_protect_locked(PROT_NONE);
}

extern "C" void emu_heap_describe(size_t off, char *buf, size_t n) {
    std::lock_guard<std::mutex> l(heap.mu);
    auto it = heap.live.upper_bound(off);
    if (it == heap.live.begin()) {
        snprintf(buf, n, "before every live allocation");
        return;
    }
    --it;
    size_t end = it->first + it->second.first;
    if (off < end)
        snprintf(buf, n, "inside the allocation of %zu bytes at offset %zu", it->second.first, it->first);
    else
        snprintf(buf, n, "%zu bytes past the end of the allocation of %zu bytes at offset %zu",
                 off - end, it->second.first, it->first);
}

extern "C" void emu_heap_bounds(char **base, size_t *cap) {
    std::lock_guard<std::mutex> l(heap.mu);
    heap_init_locked();
    *base = heap.base, *cap = heap.cap;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t n) {
    std::lock_guard<std::mutex> l(heap.mu);
    heap_init_locked();
    size_t want = (n ? n + 255 : 256) / 256 * 256;
    for (auto it = heap.free_.begin(); it != heap.free_.end(); ++it) {
        if (it->second < want) continue;
        size_t off = it->first, rest = it->second - want;
        heap.free_.erase(it);
        if (rest) heap.free_[off + want] = rest;
        heap.live[off] = {n, want};
        emu_strict_alloc(heap.cap, off, n, 1);
        heap.used += want;
        size_t end = (off + want + kPage - 1) / kPage * kPage;
        if (end > heap.top) {
            size_t old = heap.top;
            heap.top = end;
            if (heap.guard && heap.open_depth &&
                mprotect(heap.base + old, end - old, PROT_READ | PROT_WRITE))
                emu_die("mprotect");
        }
        memset(heap.alias + off, 0xCD, want); /* garbage, like real device memory */
        *p = heap.base + off;
        return cudaSuccess;
    }
    *p = nullptr;
    return cudaErrorMemoryAllocation;
}

extern "C" cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> l(heap.mu);
    if (!in_heap(p)) emu_die("cudaFree(%p): not device memory", p);
    size_t off = (size_t)((char *)p - heap.base);
    auto it = heap.live.find(off);
    if (it == heap.live.end()) emu_die("cudaFree(%p): not the start of a live allocation", p);
    size_t len = it->second.second;
    emu_strict_alloc(heap.cap, off, it->second.first, 0);
    heap.live.erase(it);
    heap.used -= len;
    auto nx = heap.free_.lower_bound(off);
    if (nx != heap.free_.end() && nx->first == off + len) len += nx->second, heap.free_.erase(nx);
    auto pv = heap.free_.lower_bound(off);
    if (pv != heap.free_.begin() && std::prev(pv)->first + std::prev(pv)->second == off) {
        --pv;
        pv->second += len;
    } else {
        heap.free_[off] = len;
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> l(heap.mu);
    heap_init_locked();
    *free_bytes = heap.cap - heap.used;
    *total_bytes = heap.cap;
    return cudaSuccess;
}

/* ================================================================ streams and events
 * A stream is a FIFO run by its own thread. Without EMU_ASYNC, kernels, GEMMs and copies run on
 * the calling thread once their stream is drained, and only NCCL operations and event waits are
 * queued. With EMU_ASYNC=1 everything is queued, and a queued item stays put until something
 * needs it (a stream or event sync, an event query, another stream's wait on it, an NCCL
 * operation queued behind it): work takes effect late, never at call time, as on a GPU. */
struct EmuStream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    uint64_t enq = 0, done = 0, released = 0; /* items queued, run, allowed to run */
    bool stop = false;
    std::thread worker;
    const char *last_op = nullptr; /* the NCCL operation queued last (EMU_STATS) */
    int id = 0;                    /* its index in the vector clocks */
    std::vector<uint64_t> vc;      /* under order_mu: per stream, the items complete before the
                                      next item queued here starts */
};
struct EmuEvent {
    EmuStream *s = nullptr;
    uint64_t seq = 0;
    std::vector<uint64_t> vc; /* the stream's clock at the record (under order_mu) */
    /* EMU_STATS: the operation the record followed, the launch count then, first wait done */
    const char *op = nullptr;
    uint64_t launches = 0;
    bool waited = false;
};

extern "C" int emu_async_enabled(void) {
    static const int on = [] {
        const char *e = getenv("EMU_ASYNC");
        return e && *e && strcmp(e, "0") != 0;
    }();
    return on;
}

/* ---- EMU_STATS: overlap of communication with computation, as the host issued it */
namespace {
/* host waits: stream syncs, and NCCL completions whose first wait was the host's (a poll or an
 * event sync) rather than a stream's (cudaStreamWaitEvent): the GPU could not go on before the
 * host saw them */
std::atomic<uint64_t> g_launches{0}, g_host_waits{0}, g_host_nccl_waits{0};
struct OverlapStats {
    std::mutex mu;
    std::map<std::string, std::pair<long, long>> by_op; /* waited, overlapped */
    ~OverlapStats() {
        if (!getenv("EMU_STATS")) return;
        fprintf(stderr, "emu-stats: host waits for a stream %llu\n",
                (unsigned long long)g_host_waits.load());
        fprintf(stderr, "emu-stats: NCCL completions waited for by the host first %llu\n",
                (unsigned long long)g_host_nccl_waits.load());
        for (auto &kv : by_op)
            fprintf(stderr, "emu-stats: %s waited %ld overlapped %ld\n", kv.first.c_str(),
                    kv.second.first, kv.second.second);
    }
};
OverlapStats g_overlap;

/* The first wait on the completion of an NCCL operation (by the host, or by a stream through
 * cudaStreamWaitEvent): overlapped when kernels or GEMMs were issued after the operation and
 * before this wait. */
void note_wait(EmuEvent *ev, bool host) {
    if (ev->waited || !ev->op) return;
    ev->waited = true;
    if (host) g_host_waits++, g_host_nccl_waits++;
    std::lock_guard<std::mutex> l(g_overlap.mu);
    auto &st = g_overlap.by_op[ev->op];
    st.first++;
    if (g_launches.load() > ev->launches) st.second++;
}
} // namespace

extern "C" void emu_note_launch(void) { g_launches++; }

/* ---- ordering: happens-before by vector clocks, so a missing wait is found whether or not the
 * operation happened to be finished. Each stream's clock says which items of every stream
 * complete before its next item starts; the host thread's clock (thread_local) what its syncs
 * showed complete. A record, an NCCL operation's device memory, may be touched by an item on
 * another stream only when that item's clock covers it. */
namespace {
struct Flight {
    const char *lo, *hi; /* device addresses */
    bool writes;
    const char *op;
    int stream = -1;  /* the stream it is queued on, and its item there */
    uint64_t seq = 0;
    bool done = false;
};
std::mutex order_mu;
std::vector<EmuStream *> g_streams; /* the live streams */
int g_stream_ids;
std::deque<Flight> g_records;
thread_local std::vector<uint64_t> host_vc;

void vc_join(std::vector<uint64_t> &a, const std::vector<uint64_t> &b) {
    if (a.size() < b.size()) a.resize(b.size());
    for (size_t i = 0; i < b.size(); i++) a[i] = a[i] > b[i] ? a[i] : b[i];
}
uint64_t vc_at(const std::vector<uint64_t> &a, int i) { return (size_t)i < a.size() ? a[i] : 0; }
void vc_set(std::vector<uint64_t> &a, int i, uint64_t v) {
    if (a.size() <= (size_t)i) a.resize((size_t)i + 1);
    if (a[i] < v) a[i] = v;
}

void register_stream(EmuStream *s) {
    std::lock_guard<std::mutex> l(order_mu);
    s->id = g_stream_ids++;
    s->vc = host_vc;
    g_streams.push_back(s);
}

EmuStream *legacy_default() {
    static EmuStream *d = [] { /* never destroyed: its thread may outlive main */
        EmuStream *s = new EmuStream;
        register_stream(s);
        return s;
    }();
    return d;
}
EmuStream *S(cudaStream_t s) { return s ? s : legacy_default(); }

/* The clock of the item the host thread queues next on s (with order_mu held). */
std::vector<uint64_t> &item_clock_locked(EmuStream *s) {
    vc_join(s->vc, host_vc);
    return s->vc;
}

/* The first record [lo, hi) of an item on s conflicts with: overlapping, one side writing,
 * on another stream and not ordered before the item (with order_mu held). */
const Flight *conflict_locked(EmuStream *s, const char *lo, const char *hi, bool writes) {
    const std::vector<uint64_t> &vc = item_clock_locked(s);
    for (const Flight &f : g_records)
        if (lo < f.hi && f.lo < hi && (writes || f.writes) && f.stream != s->id &&
            vc_at(vc, f.stream) < f.seq)
            return &f;
    return nullptr;
}

/* Drops the records every stream's clock covers (and, past 4096, the oldest finished ones: a
 * stream that never waits on a communicator must not make the list grow without end). */
void prune_locked() {
    for (auto it = g_records.begin(); it != g_records.end();) {
        bool all = it->done;
        for (EmuStream *s : g_streams)
            if (all && s->id != it->stream && vc_at(s->vc, it->stream) < it->seq) all = false;
        it = all ? g_records.erase(it) : std::next(it);
    }
    while (g_records.size() > 4096 && g_records.front().done) g_records.pop_front();
}

void order_die(const char *what, const char *verb, size_t n, const void *p,
                            const Flight *f) {
    emu_die("%s %s %zu bytes at %p that an %s on another stream %s, with nothing ordering them "
            "(no cudaStreamWaitEvent on its event, no host sync after it)",
            what, verb, n, p, f->op, f->writes ? "writes" : "reads");
}

void check_range(EmuStream *s, const char *what, const void *p, size_t n, bool writes) {
    if (!n || !in_heap(p)) return;
    std::lock_guard<std::mutex> l(order_mu);
    const char *lo = (const char *)p;
    if (const Flight *f = conflict_locked(s, lo, lo + n, writes))
        order_die(what, writes ? "writes" : "reads", n, p, f);
}

void worker_loop(EmuStream *s) {
    std::unique_lock<std::mutex> l(s->mu);
    for (;;) {
        s->cv.wait(l, [&] { return s->stop || (!s->q.empty() && s->done < s->released); });
        if (s->q.empty() || s->done >= s->released) return; /* stopped */
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        l.unlock();
        f();
        l.lock();
        s->done++;
        s->cv.notify_all();
    }
}

/* Lets s run its items up to seq. */
void release(EmuStream *s, uint64_t seq) {
    std::lock_guard<std::mutex> l(s->mu);
    if (seq <= s->released) return;
    s->released = seq;
    s->cv.notify_all();
}

/* Queues f on s, to run on the stream's own thread after everything queued before it: at once
 * unless EMU_ASYNC holds it until needed (now: an NCCL operation, which its peers wait for).
 * Returns its item number. */
uint64_t enqueue(EmuStream *s, std::function<void()> f, bool now) {
    std::lock_guard<std::mutex> l(s->mu);
    if (!s->worker.joinable()) s->worker = std::thread(worker_loop, s);
    s->q.push_back(std::move(f));
    s->enq++;
    if (now || !emu_async_enabled()) s->released = s->enq;
    s->cv.notify_all();
    return s->enq;
}

void wait_done(EmuStream *s, uint64_t seq) {
    release(s, seq);
    std::unique_lock<std::mutex> l(s->mu);
    s->cv.wait(l, [&] { return s->done >= seq; });
}

/* The host has seen s complete up to item seq (a sync): what s knew then is known to it. */
void host_learns(EmuStream *s, uint64_t seq) {
    std::lock_guard<std::mutex> l(order_mu);
    vc_join(host_vc, s->vc);
    vc_set(host_vc, s->id, seq);
}

uint64_t queued(EmuStream *s) {
    std::lock_guard<std::mutex> l(s->mu);
    return s->enq;
}
} // namespace

extern "C" void emu_stream_drain(cudaStream_t st) {
    EmuStream *s = S(st);
    wait_done(s, queued(s));
}

void emu_enqueue(cudaStream_t st, std::function<void()> f) { enqueue(S(st), std::move(f), false); }

extern "C" void emu_check_in_flight(cudaStream_t st, const char *kernel, const char *host_fn,
                                    int arg, const void *p, int writable) {
    if (!p || !in_heap(p)) return;
    EmuStream *s = S(st); /* before order_mu: the legacy stream registers itself under it */
    std::lock_guard<std::mutex> l(order_mu);
    const char *c = (const char *)p;
    if (const Flight *f = conflict_locked(s, c, c + 1, writable))
        emu_die("kernel %s launched by %s: argument %d (%p) is memory an %s on another stream %s, "
                "with nothing ordering them (no cudaStreamWaitEvent on its event, no host sync "
                "after it)",
                kernel, host_fn, arg + 1, p, f->op, f->writes ? "writes" : "reads");
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new EmuStream;
    register_stream(*s);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaErrorInvalidValue;
    emu_stream_drain(s);
    {
        std::lock_guard<std::mutex> l(s->mu);
        s->stop = true;
        s->cv.notify_all();
    }
    if (s->worker.joinable()) s->worker.join();
    {
        std::lock_guard<std::mutex> l(order_mu);
        for (size_t i = 0; i < g_streams.size(); i++)
            if (g_streams[i] == s) g_streams.erase(g_streams.begin() + (long)i);
    }
    delete s;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    g_host_waits++;
    EmuStream *s = S(st);
    uint64_t seq = queued(s);
    wait_done(s, seq);
    host_learns(s, seq);
    return cudaSuccess;
}

/* Every stream, as the device-wide sync does. */
extern "C" cudaError_t cudaDeviceSynchronize(void) {
    std::vector<EmuStream *> all;
    legacy_default();
    {
        std::lock_guard<std::mutex> l(order_mu);
        all = g_streams;
    }
    for (EmuStream *s : all) {
        uint64_t seq = queued(s);
        wait_done(s, seq);
        host_learns(s, seq);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned) {
    *ev = new EmuEvent;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    delete ev;
    return cudaSuccess;
}

/* An event completes when its stream has done everything queued before the record. */
extern "C" cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
    EmuStream *s = S(st);
    std::lock_guard<std::mutex> lo(order_mu);
    std::lock_guard<std::mutex> l(s->mu);
    ev->s = s;
    ev->seq = s->enq;
    ev->vc = item_clock_locked(s);
    vc_set(ev->vc, s->id, s->enq);
    ev->op = s->last_op;
    s->last_op = nullptr;
    ev->launches = g_launches.load();
    ev->waited = false;
    return cudaSuccess;
}

namespace {
/* The event's stream and item, and (when learn) its clock joined into the host's. */
EmuStream *event_target(cudaEvent_t ev, uint64_t *seq) {
    std::lock_guard<std::mutex> l(order_mu);
    *seq = ev->seq;
    return ev->s;
}
void host_learns_event(cudaEvent_t ev) {
    std::lock_guard<std::mutex> l(order_mu);
    vc_join(host_vc, ev->vc);
}
} // namespace

extern "C" cudaError_t cudaEventQuery(cudaEvent_t ev) {
    note_wait(ev, true);
    uint64_t seq;
    EmuStream *s = event_target(ev, &seq);
    if (s) {
        release(s, seq); /* a GPU runs the work by itself: polling must see it finish */
        std::lock_guard<std::mutex> l(s->mu);
        if (s->done < seq) return cudaErrorNotReady;
    }
    host_learns_event(ev);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    note_wait(ev, true);
    uint64_t seq;
    EmuStream *s = event_target(ev, &seq);
    if (s) wait_done(s, seq);
    host_learns_event(ev);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned) {
    note_wait(ev, false);
    EmuStream *s = S(st), *es;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> l(order_mu);
        es = ev->s, seq = ev->seq;
        vc_join(item_clock_locked(s), ev->vc);
    }
    if (!es || es == s) return cudaSuccess;
    enqueue(s, [es, seq] { wait_done(es, seq); }, false);
    return cudaSuccess;
}

/* ================================================================ copies
 * Checked against where the pointers live (the kind must match) and against NCCL operations
 * nothing orders them after; they run through the alias mapping. Without EMU_ASYNC on the
 * caller's thread once the stream is drained. With it, as CUDA specifies: a copy from pageable
 * host memory has read its source when the call returns (staged), one into pageable memory
 * returns when done; with page-locked (cudaMallocHost) memory the call returns at once, the
 * destination holds poison (0xFF bytes: NaN as floats) until the copy runs, and a source the
 * host changes before the copy runs is reported. */
namespace {
std::mutex pinned_mu;
std::map<const char *, size_t> g_pinned; /* cudaMallocHost's blocks */

bool pinned(const void *p, size_t n) {
    std::lock_guard<std::mutex> l(pinned_mu);
    auto it = g_pinned.upper_bound((const char *)p);
    if (it == g_pinned.begin()) return false;
    --it;
    return (const char *)p + n <= it->first + it->second;
}

const char *kind_name(cudaMemcpyKind kind) {
    return kind == cudaMemcpyHostToDevice   ? "HostToDevice"
           : kind == cudaMemcpyDeviceToHost ? "DeviceToHost"
                                            : "DeviceToDevice";
}

void copy_checked(EmuStream *st, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                  const char *what, bool async) {
    bool dd = in_heap(dst), sd = in_heap(src);
    bool want_dd = kind != cudaMemcpyDeviceToHost, want_sd = kind != cudaMemcpyHostToDevice;
    if (dd != want_dd || sd != want_sd)
        emu_die("%s(%p <- %p, %zu bytes, %s): the destination is %s memory and the source %s",
                what, dst, src, n, kind_name(kind), dd ? "device" : "host", sd ? "device" : "host");
    if (!n) return;
    check_range(st, what, src, n, false);
    check_range(st, what, dst, n, true);
    char *d = dd ? dev_alias(dst, n, what) : (char *)dst;
    const char *s = sd ? dev_alias(src, n, what) : (const char *)src;
    if (!async || !emu_async_enabled()) {
        emu_stream_drain(st);
        memmove(d, s, n);
        return;
    }
    if (!dd && !pinned(dst, n)) { /* into pageable memory: done when the call returns */
        emu_stream_drain(st);
        memmove(d, s, n);
        return;
    }
    if (!dd) memset(d, 0xFF, n); /* page-locked: poison until the stream gets there */
    std::shared_ptr<std::vector<char>> snap;
    if (!sd) snap = std::make_shared<std::vector<char>>(s, s + n);
    bool reuse_check = !sd && pinned(src, n);
    enqueue(st, [=] {
        if (reuse_check && memcmp(s, snap->data(), n) != 0)
            emu_die("%s(%p <- %p, %zu bytes, HostToDevice): the page-locked source changed before "
                    "the copy ran; reuse it only after a stream or event sync shows the copy done",
                    what, dst, src, n);
        memmove(d, snap ? snap->data() : s, n);
    }, false);
}
} // namespace

extern "C" cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> l(pinned_mu);
    g_pinned[(const char *)*p] = n;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *p) {
    if (in_heap(p)) emu_die("cudaFreeHost(%p): that is device memory", p);
    {
        std::lock_guard<std::mutex> l(pinned_mu);
        g_pinned.erase((const char *)p);
    }
    free(p);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                                       cudaStream_t s) {
    copy_checked(S(s), dst, src, n, kind, "cudaMemcpyAsync", true);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                         size_t width, size_t height, cudaMemcpyKind kind,
                                         cudaStream_t s) {
    if (width > dpitch || width > spitch) emu_die("cudaMemcpy2DAsync: width above a pitch");
    for (size_t r = 0; r < height; r++)
        copy_checked(S(s), (char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind,
                     "cudaMemcpy2DAsync", true);
    return cudaSuccess;
}

/* On the legacy default stream, returning when done; it does not wait for the other streams
 * (every stream the code makes is non-blocking). */
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    copy_checked(legacy_default(), dst, src, n, kind, "cudaMemcpy", false);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
    EmuStream *s = S(st);
    check_range(s, "cudaMemset", p, n, true);
    if (!n) return cudaSuccess;
    char *d = dev_alias(p, n, "cudaMemset");
    if (emu_async_enabled()) {
        enqueue(s, [d, v, n] { memset(d, v, n); }, false);
        return cudaSuccess;
    }
    emu_stream_drain(s);
    memset(d, v, n);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, nullptr); }

/* ================================================================ devices */
extern "C" cudaError_t cudaGetDeviceCount(int *n) {
    const char *g = getenv("EMU_GPUS");
    *n = g ? atoi(g) : 1;
    return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

extern "C" cudaError_t cudaSetDevice(int d) {
    int n = 0;
    cudaGetDeviceCount(&n);
    return d >= 0 && d < n ? cudaSuccess : cudaErrorInvalidValue;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int) {
    *v = a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 166912 : 108; /* A100 */
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetLastError(void) { return cudaSuccess; }

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (emulated device heap, EMU_DEVICE_MB)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (EMU_GPUS=0)";
    case cudaErrorNotReady: return "device not ready";
    default: return "invalid argument";
    }
}

/* ================================================================ NCCL
 * A communicator is a shared-memory segment named by its unique id: a barrier, one staging slot
 * per rank for the collectives, and a byte ring per ordered pair of ranks for send/recv. Waits
 * sleep on futexes in that segment (with a timeout, to notice an abort or a dead peer). */
namespace {
const size_t kSlot = 1 << 20, kRing = 1 << 18;
const int kMaxRanks = 64;

struct Ring {
    std::atomic<uint32_t> wr, rd; /* bytes written and read, mod 2^32 */
};
struct Shared {
    std::atomic<uint32_t> count, gen, joined, bell[kMaxRanks];
    int32_t pid[kMaxRanks];
};

size_t seg_bytes(int n) {
    return sizeof(Shared) + (size_t)n * kSlot + (size_t)n * n * (sizeof(Ring) + kRing);
}

long futex(std::atomic<uint32_t> *w, int op, uint32_t v, const struct timespec *t) {
    return syscall(SYS_futex, (uint32_t *)w, op, v, t, nullptr, 0);
}
void wake_all(std::atomic<uint32_t> *w) { futex(w, FUTEX_WAKE, INT32_MAX, nullptr); }
} // namespace

struct EmuNccl {
    int n = 0, rank = 0;
    Shared *sh = nullptr;
    char *slots = nullptr, *rings = nullptr;
    uint32_t gen = 0;
    std::atomic<int> err{ncclSuccess}, aborted{0}, pending{0};
    char name[sizeof(ncclUniqueId)];

    char *slot(int r) { return slots + (size_t)r * kSlot; }
    Ring *ring(int from, int to) {
        return (Ring *)(rings + ((size_t)from * n + to) * (sizeof(Ring) + kRing));
    }
    char *ring_data(int from, int to) { return (char *)(ring(from, to) + 1); }

    /* Sleeps until *w != v, a timeout slice passes, or the op must end. False: end it. */
    bool nap(std::atomic<uint32_t> *w, uint32_t v) {
        struct timespec t = {0, 50 * 1000 * 1000};
        long r0 = futex(w, FUTEX_WAIT, v, &t);
        if (aborted.load()) return false;
        if (r0 == 0 || errno != ETIMEDOUT) return true;
        for (int r = 0; r < n; r++)
            if (sh->pid[r] > 0 && kill(sh->pid[r], 0) != 0) {
                fprintf(stderr, "emu nccl: %s: rank %d (pid %d) has died\n", name, r, sh->pid[r]);
                err = ncclSystemError;
                return false;
            }
        return true;
    }

    bool barrier() {
        uint32_t g = gen++;
        if (sh->count.fetch_add(1) + 1 == (uint32_t)n) {
            sh->count.store(0);
            sh->gen.store(g + 1);
            wake_all(&sh->gen);
            return true;
        }
        while (sh->gen.load() == g)
            if (!nap(&sh->gen, g)) return false;
        return true;
    }
};

namespace {
thread_local int group_depth; /* inside ncclGroupStart/End: the send/recv of the group */
thread_local EmuNccl *group_comm;
thread_local cudaStream_t group_stream;

size_t dtype_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

double load(const char *p, ncclDataType_t t, size_t i) {
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    case ncclBfloat16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: emu_die("emu nccl: data type %d is not emulated", (int)t);
    }
    return 0;
}

void store(char *p, ncclDataType_t t, size_t i, double v) {
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        u += 0x7FFFu + ((u >> 16) & 1u);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        break;
    }
    default: emu_die("emu nccl: data type %d is not emulated", (int)t);
    }
}

/* out[i] = op over ranks r (in rank order) of part(r)[i], i < cnt. fp32 sums in fp32 like a
 * GPU would (sequentially, in rank order), everything else in double. */
void reduce_into(EmuNccl *c, char *out, size_t cnt, ncclDataType_t t, ncclRedOp_t op,
                 const std::function<const char *(int)> &part) {
    for (size_t i = 0; i < cnt; i++) {
        double acc = load(part(0), t, i);
        float accf = (float)acc;
        for (int r = 1; r < c->n; r++) {
            double v = load(part(r), t, i);
            switch (op) {
            case ncclSum: case ncclAvg: acc += v, accf += (float)v; break;
            case ncclProd: acc *= v, accf *= (float)v; break;
            case ncclMax: acc = v > acc ? v : acc, accf = (float)acc; break;
            case ncclMin: acc = v < acc ? v : acc, accf = (float)acc; break;
            }
        }
        if (t == ncclFloat32) acc = accf;
        if (op == ncclAvg) acc = t == ncclFloat32 ? (double)(accf / (float)c->n) : acc / c->n;
        store(out, t, i, acc);
    }
}

/* Queues operation `what` of `c` on stream s; it reads and writes `mem` until it completes. */
ncclResult_t submit(EmuNccl *c, cudaStream_t s, const char *what, std::vector<Flight> mem,
                    std::function<bool()> op) {
    if (!c) return ncclInvalidArgument;
    if (c->err.load() != ncclSuccess) return (ncclResult_t)c->err.load();
    EmuStream *st = S(s);
    std::lock_guard<std::mutex> lo(order_mu); /* its records go in with the item's number */
    for (size_t i = 0; i < mem.size(); i++) {
        if (mem[i].lo == mem[i].hi) {
            mem.erase(mem.begin() + (long)i--);
            continue;
        }
        if (const Flight *f = conflict_locked(st, mem[i].lo, mem[i].hi, mem[i].writes))
            emu_die("%s %s %p..%p that an %s on another stream %s, with nothing ordering them", what,
                    mem[i].writes ? "writes" : "reads", (const void *)mem[i].lo,
                    (const void *)mem[i].hi, f->op, f->writes ? "writes" : "reads");
    }
    {
        std::lock_guard<std::mutex> l(st->mu);
        st->last_op = what;
    }
    c->pending++;
    std::shared_ptr<uint64_t> seq = std::make_shared<uint64_t>(0);
    /* queued now (its peers wait for it): that lets its stream, and what it waits for, run */
    *seq = enqueue(st, [c, op, seq, st] {
        if (!c->aborted.load() && c->err.load() == ncclSuccess && !op() && !c->aborted.load() &&
            c->err.load() == ncclSuccess)
            c->err = ncclInternalError;
        {
            std::lock_guard<std::mutex> l(order_mu);
            for (Flight &f : g_records)
                if (f.stream == st->id && f.seq == *seq) f.done = true;
        }
        c->pending--;
    }, true);
    for (Flight &f : mem) {
        f.op = what, f.stream = st->id, f.seq = *seq;
        g_records.push_back(f);
    }
    prune_locked();
    return ncclSuccess;
}
} // namespace

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static std::atomic<int> counter{0};
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "/emu-nccl-%d-%d-%lx", (int)getpid(),
             counter.fetch_add(1), (unsigned long)ts.tv_nsec);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int n, ncclUniqueId id, int rank,
                                               ncclConfig_t *) {
    if (n < 1 || n > kMaxRanks || rank < 0 || rank >= n || id.internal[0] != '/')
        return ncclInvalidArgument;
    EmuNccl *c = new EmuNccl;
    c->n = n, c->rank = rank;
    snprintf(c->name, sizeof c->name, "%s", id.internal);
    int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
    size_t bytes = seg_bytes(n);
    if (fd < 0 || ftruncate(fd, (off_t)bytes)) {
        delete c;
        return ncclSystemError;
    }
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        delete c;
        return ncclSystemError;
    }
    c->sh = (Shared *)m;
    c->slots = (char *)m + sizeof(Shared);
    c->rings = c->slots + (size_t)n * kSlot;
    c->sh->pid[rank] = (int32_t)getpid();
    if (c->sh->joined.fetch_add(1) + 1 == (uint32_t)n) shm_unlink(c->name); /* all have it open */
    *out = c;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, n, id, rank, nullptr);
}

extern "C" ncclResult_t ncclCommFinalize(ncclComm_t c) {
    while (c->pending.load() && !c->aborted.load()) usleep(200);
    return (ncclResult_t)c->err.load();
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    while (c->pending.load()) usleep(200); /* the stream threads may still be in an op */
    munmap(c->sh, seg_bytes(c->n));
    delete c;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    c->aborted = 1;
    wake_all(&c->sh->gen);
    wake_all(&c->sh->bell[c->rank]);
    return ncclSuccess; /* leaked on purpose: an aborted op may still be unwinding */
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
    *e = (ncclResult_t)c->err.load();
    return ncclSuccess;
}

extern "C" const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "system error (emulated: a peer process died)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclInProgress: return "operation in progress";
    default: return "internal error";
    }
}

extern "C" ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                                      ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    size_t es = dtype_size(t), bytes = count * es;
    const char *sa = dev_alias(send, bytes, "ncclAllReduce send");
    char *ra = dev_alias(recv, bytes, "ncclAllReduce recv");
    const char *sd = (const char *)send, *rd = (const char *)recv;
    std::vector<Flight> mem = {{sd, sd + bytes, false, nullptr}, {rd, rd + bytes, true, nullptr}};
    if (send == recv) mem.erase(mem.begin());
    return submit(c, s, "ncclAllReduce", mem, [=] {
        size_t per = kSlot / es;
        for (size_t off = 0; off < count; off += per) {
            size_t k = count - off < per ? count - off : per;
            memcpy(c->slot(c->rank), sa + off * es, k * es);
            if (!c->barrier()) return false;
            reduce_into(c, ra + off * es, k, t, op, [&](int r) { return c->slot(r); });
            if (!c->barrier()) return false;
        }
        return true;
    });
}

extern "C" ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                                      ncclComm_t c, cudaStream_t s) {
    size_t es = dtype_size(t);
    const char *sa = dev_alias(send, count * es, "ncclAllGather send");
    char *ra = dev_alias(recv, count * es * c->n, "ncclAllGather recv");
    const char *sd = (const char *)send, *rd = (const char *)recv;
    size_t sb = count * es, rb = count * es * c->n;
    std::vector<Flight> mem = {{rd, rd + rb, true, nullptr}};
    if (!(sd >= rd && sd + sb <= rd + rb)) mem.push_back({sd, sd + sb, false, nullptr});
    return submit(c, s, "ncclAllGather", mem, [=] {
        size_t per = kSlot / es;
        for (size_t off = 0; off < count; off += per) {
            size_t k = count - off < per ? count - off : per;
            memcpy(c->slot(c->rank), sa + off * es, k * es);
            if (!c->barrier()) return false;
            for (int r = 0; r < c->n; r++)
                memcpy(ra + ((size_t)r * count + off) * es, c->slot(r), k * es);
            if (!c->barrier()) return false;
        }
        return true;
    });
}

extern "C" ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count,
                                          ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                          cudaStream_t s) {
    size_t es = dtype_size(t);
    const char *sa = dev_alias(send, count * es * c->n, "ncclReduceScatter send");
    char *ra = dev_alias(recv, count * es, "ncclReduceScatter recv");
    const char *sd = (const char *)send, *rd = (const char *)recv;
    size_t sb = count * es * c->n, rb = count * es;
    std::vector<Flight> mem = {{sd, sd + sb, false, nullptr}};
    if (rd >= sd && rd + rb <= sd + sb) mem[0].writes = true; /* in place: the block is written */
    else mem.push_back({rd, rd + rb, true, nullptr});
    return submit(c, s, "ncclReduceScatter", mem, [=] {
        size_t per = kSlot / es / c->n;
        for (size_t off = 0; off < count; off += per) {
            size_t k = count - off < per ? count - off : per;
            for (int j = 0; j < c->n; j++) /* slot: block j's chunk, for every j */
                memcpy(c->slot(c->rank) + (size_t)j * k * es, sa + ((size_t)j * count + off) * es,
                       k * es);
            if (!c->barrier()) return false;
            reduce_into(c, ra + off * es, k, t, op,
                        [&](int r) { return c->slot(r) + (size_t)c->rank * k * es; });
            if (!c->barrier()) return false;
        }
        return true;
    });
}

extern "C" ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t,
                                      int root, ncclComm_t c, cudaStream_t s) {
    size_t es = dtype_size(t);
    if (root < 0 || root >= c->n) return ncclInvalidArgument;
    const char *sa = c->rank == root ? dev_alias(send, count * es, "ncclBroadcast send") : nullptr;
    char *ra = dev_alias(recv, count * es, "ncclBroadcast recv");
    const char *rd = (const char *)recv;
    std::vector<Flight> mem = {{rd, rd + count * es, true, nullptr}};
    return submit(c, s, "ncclBroadcast", mem, [=] {
        size_t per = kSlot / es;
        for (size_t off = 0; off < count; off += per) {
            size_t k = count - off < per ? count - off : per;
            if (c->rank == root) memcpy(c->slot(root), sa + off * es, k * es);
            if (!c->barrier()) return false;
            memmove(ra + off * es, c->slot(root), k * es);
            if (!c->barrier()) return false;
        }
        return true;
    });
}

/* ---- point to point: inside a group every send and receive progresses together, so a batch in
 * which two ranks send to each other cannot deadlock on full rings */
namespace {
struct P2p {
    bool is_send;
    int peer;
    char *buf;
    size_t bytes, moved;
};

bool run_p2p(EmuNccl *c, std::vector<P2p> ops) {
    for (;;) {
        uint32_t bell = c->sh->bell[c->rank].load();
        bool all = true, progress = false;
        /* in order per peer and direction: an op starts only when the earlier one is done */
        std::vector<char> busy_s(c->n, 0), busy_r(c->n, 0);
        for (P2p &o : ops) {
            if (o.moved == o.bytes) continue;
            all = false;
            std::vector<char> &busy = o.is_send ? busy_s : busy_r;
            if (busy[o.peer]) continue;
            busy[o.peer] = 1;
            Ring *rg = o.is_send ? c->ring(c->rank, o.peer) : c->ring(o.peer, c->rank);
            char *data = o.is_send ? c->ring_data(c->rank, o.peer) : c->ring_data(o.peer, c->rank);
            uint32_t wr = rg->wr.load(), rd = rg->rd.load();
            size_t avail = o.is_send ? kRing - (uint32_t)(wr - rd) : (uint32_t)(wr - rd);
            size_t k = o.bytes - o.moved < avail ? o.bytes - o.moved : avail;
            for (size_t done = 0; done < k;) { /* the ring wraps */
                size_t pos = ((o.is_send ? wr : rd) + done) % kRing;
                size_t run = kRing - pos < k - done ? kRing - pos : k - done;
                if (o.is_send)
                    memcpy(data + pos, o.buf + o.moved + done, run);
                else
                    memcpy(o.buf + o.moved + done, data + pos, run);
                done += run;
            }
            if (!k) continue;
            o.moved += k;
            progress = true;
            if (o.is_send)
                rg->wr.store(wr + (uint32_t)k);
            else
                rg->rd.store(rd + (uint32_t)k);
            c->sh->bell[o.peer].fetch_add(1); /* the peer may wait for data or for room */
            wake_all(&c->sh->bell[o.peer]);
        }
        if (all) return true;
        if (!progress && !c->nap(&c->sh->bell[c->rank], bell)) return false;
    }
}

thread_local std::vector<P2p> pending_p2p;

/* The device memory of a batch of sends (read) and receives (written). */
std::vector<Flight> p2p_memory(const std::vector<P2p> &ops) {
    std::vector<Flight> mem;
    for (const P2p &o : ops) {
        const char *lo = heap.base + (o.buf - heap.alias); /* o.buf is the alias address */
        mem.push_back({lo, lo + o.bytes, !o.is_send, nullptr});
    }
    return mem;
}

ncclResult_t p2p(bool is_send, const void *buf, size_t count, ncclDataType_t t, int peer,
                 EmuNccl *c, cudaStream_t s) {
    if (!c || peer < 0 || peer >= c->n) return ncclInvalidArgument;
    size_t bytes = count * dtype_size(t);
    P2p o = {is_send, peer, dev_alias(buf, bytes, is_send ? "ncclSend" : "ncclRecv"), bytes, 0};
    if (group_depth) {
        if (group_comm && (group_comm != c || group_stream != s))
            emu_die("emu nccl: one group spans two communicators or streams (not emulated)");
        group_comm = c, group_stream = s;
        pending_p2p.push_back(o);
        return ncclSuccess;
    }
    std::vector<P2p> one{o};
    return submit(c, s, is_send ? "ncclSend" : "ncclRecv", p2p_memory(one),
                  [c, one] { return run_p2p(c, one); });
}
} // namespace

extern "C" ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer,
                                 ncclComm_t c, cudaStream_t s) {
    return p2p(true, buf, count, t, peer, c, s);
}

extern "C" ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                                 cudaStream_t s) {
    return p2p(false, buf, count, t, peer, c, s);
}

extern "C" ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth) return ncclSuccess;
    EmuNccl *c = group_comm;
    cudaStream_t s = group_stream;
    std::vector<P2p> ops;
    ops.swap(pending_p2p);
    group_comm = nullptr, group_stream = nullptr;
    if (ops.empty()) return ncclSuccess;
    return submit(c, s, "ncclSend/Recv group", p2p_memory(ops),
                  [c, ops] { return run_p2p(c, ops); });
}
