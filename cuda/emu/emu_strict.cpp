/* emu_strict: the emulator's strict mode (EMU_STRICT=1; contract in emu_rt.h). The kernels of
 * the emulator build are compiled with -fsanitize=thread, which calls __tsan_readN/__tsan_writeN
 * before every memory access; this file is the runtime those calls reach (no libtsan is linked).
 * Outside strict mode, or outside a kernel, a call returns at once. In a kernel it checks:
 *   - shared memory (the static __shared__ arrays, which register themselves with
 *     emu_shared_reg as a thread passes their declaration, and the launch's dynamic buffer): a
 * shadow per 2 bytes holds the last writer thread with its barrier epoch and warp epoch, and a
 * summary of the readers; an access by another thread in the same barrier interval (and, within one
 * warp, the same __syncwarp interval) that writes, or reads what another wrote, is a race. Reading
 * shared memory no thread of the block wrote is reported too (it holds another block's data on a
 * GPU);
 *   - global memory: a shadow per 2 bytes holds the block that last wrote and read it in this
 *     launch; a block writing what another block wrote or read, or reading what another wrote,
 *     in the same launch is a race (blocks run in any order, or at once, on a GPU), except
 *     atomics (atomicAdd) of several blocks on one word, not a plain access of another block; and
 * every byte touched lies in a live allocation, the bytes asked for (an electric fence without the
 * guard pages: the allocator's rounding slack, a neighbour or freed memory all stop it). A finding
 * names the kernel, the block, both threads, the word and the source lines (addr2line on the return
 * addresses) and ends the process with status 3. */
#include "emu_rt.h"

#include <dlfcn.h>
#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
int emu_strict_on = -1;
thread_local int emu_strict_tid = -1;
}

namespace {
struct SmemShadow {  /* per 2 bytes of shared memory */
    uint32_t wb, ww; /* the last write's block and warp epochs */
    uint32_t rb, rw; /* the latest read's block and warp epochs */
    int16_t wt, rt;  /* the writer; the reader, -1 several lanes of one warp, -2 of several warps */
    int16_t rwarp, pend;   /* the readers' warp; a cp.async to it is in flight (1) */
    const void *wpc, *rpc; /* where they were */
};
struct GlobShadow {
    uint32_t w, r, a;
}; /* per 2 bytes: the block tags that wrote, read and atomically updated it last */

struct Array { /* a static __shared__ array and its shadow */
    char *lo, *hi;
    std::vector<SmemShadow> sh;
};

struct State {
    const char *kernel = "";
    unsigned nblocks = 0, bx = 0, by = 0, bz = 0;
    uint32_t epoch = 1, block_start = 1; /* barrier epoch of the block running, and its first */
    uint32_t wepoch[32] = {};
    uint32_t counter = 1; /* source of fresh epochs */
    char *dyn = nullptr;
    size_t dyn_n = 0, smem_limit = 0, static_n = 0; /* per block: limit of static + dynamic */
    std::vector<Array> arrays;                      /* every static __shared__ array seen */
    std::vector<Array *> cur;                       /* those of the running launch */
    std::vector<SmemShadow> dy;                     /* dynamic shared memory */
    char *heap = nullptr;
    size_t heap_cap = 0;
    GlobShadow *gs = nullptr;       /* heap_cap / 2 entries, mapped on demand */
    uint8_t *live = nullptr;        /* a bit per heap byte: inside a live allocation (the fence) */
    uint32_t tag_base = 1, tag = 1; /* first block tag of this launch, the running block's */
};
State S;

std::string where(const void *pc) {
    if (!pc) return "?";
    Dl_info di;
    if (!dladdr(pc, &di) || !di.dli_fname) return "?";
    uintptr_t a = (uintptr_t)pc - 1; /* the call instruction, not the one after it */
    if (((const Elf64_Ehdr *)di.dli_fbase)->e_type == ET_DYN) a -= (uintptr_t)di.dli_fbase;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "addr2line -e '%s' 0x%lx 2>/dev/null", di.dli_fname,
             (unsigned long)a);
    std::string out;
    if (FILE *f = popen(cmd, "r")) {
        char line[512];
        if (fgets(line, sizeof line, f)) out = line;
        pclose(f);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    size_t d = out.find(" (discriminator");
    if (d != std::string::npos) out.resize(d);
    return out.empty() || out[0] == '?' ? "?" : out;
}

[[noreturn]] void report(const char *what, const char *space, size_t off, int t, const void *pc,
                         int other, const void *opc) {
    emu_strict_tid = -1;
    fprintf(
        stderr,
        "emu strict: %s in kernel %s, block (%u,%u,%u): %s word %zu (byte %zu): thread %d at %s",
        what, S.kernel, S.bx, S.by, S.bz, space, off / 4, off, t, where(pc).c_str());
    if (other >= 0)
        fprintf(stderr, "; thread %d at %s", other, where(opc).c_str());
    else if (other == -1)
        fprintf(stderr, "; other lanes of its warp read it");
    else if (other == -2)
        fprintf(stderr, "; threads of other warps read it");
    else if (opc)
        fprintf(stderr, "; the other access at %s", where(opc).c_str());
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(3);
}

void smem(std::vector<SmemShadow> &sh, const char *space, size_t off, size_t n, bool write,
          const void *pc) {
    const int t = emu_strict_tid, w = t / 32;
    const uint32_t E = S.epoch, W = S.wepoch[w];
    for (size_t i = off / 2; i <= (off + n - 1) / 2 && i < sh.size(); i++) {
        SmemShadow &s = sh[i];
        if (s.pend)
            report("shared-memory access to a cp.async destination before the "
                   "cp.async.wait_group that lands it",
                   space, i * 2, t, pc, s.wt, s.wpc);
        if (s.wb == E && s.wt != t && (s.wt / 32 != w || s.ww == W))
            report(write ? "shared-memory write-write race"
                         : "shared-memory race (read of another thread's write)",
                   space, i * 2, t, pc, s.wt, s.wpc);
        if (!write && s.wb < S.block_start)
            report("read of shared memory no thread of this block wrote", space, i * 2, t, pc, -3,
                   nullptr);
        if (write) {
            if (s.rb == E) {
                int rw = s.rt >= 0 ? s.rt / 32 : s.rwarp;
                if (s.rt == -2 || rw != w || (s.rw == W && s.rt != t))
                    report("shared-memory race (write of what another thread read)", space, i * 2,
                           t, pc, s.rt, s.rpc);
            }
            s.wb = E, s.ww = W, s.wt = (int16_t)t, s.wpc = pc;
        } else if (s.rb != E) {
            s.rb = E, s.rw = W, s.rt = (int16_t)t, s.rwarp = (int16_t)w, s.rpc = pc;
        } else if (s.rt == -2 || (s.rt >= 0 ? s.rt / 32 : s.rwarp) != w) {
            s.rt = -2;
        } else if (s.rw != W) {
            s.rw = W, s.rt = (int16_t)t, s.rpc = pc;
        } else if (s.rt != t) {
            s.rt = -1;
        }
    }
}

/* The fence: every byte a kernel touches lies inside a live allocation (the bytes asked for, not
 * the allocator's rounding): an overrun into the slack or a neighbour, or a freed buffer, stops. */
void fence(size_t off, size_t n, bool write, const void *pc) {
    for (size_t i = off; i < off + n; i++) {
        if (S.live && (S.live[i >> 3] >> (i & 7) & 1)) continue;
        char at[200];
        emu_heap_describe(i, at, sizeof at);
        const int t = emu_strict_tid;
        emu_strict_tid = -1;
        fprintf(stderr,
                "emu strict: out-of-bounds %s in kernel %s, block (%u,%u,%u): thread %d at %s "
                "%s %zu bytes at device heap byte %zu, byte %zu of them %s\n",
                write ? "write" : "read", S.kernel, S.bx, S.by, S.bz, t, where(pc).c_str(),
                write ? "writes" : "reads", n, off, i - off, at);
        fflush(stderr);
        _exit(3);
    }
}

void gmem(size_t off, size_t n, bool write, const void *pc) {
    if (!S.gs) return;
    fence(off, n, write, pc);
    for (size_t i = off / 2; i <= (off + n - 1) / 2; i++) {
        GlobShadow &g = S.gs[i];
        if (g.w >= S.tag_base && g.w != S.tag)
            report(write ? "global-memory write conflict between blocks (another block wrote it)"
                         : "global-memory race between blocks (read of another block's write)",
                   "device heap", i * 2, emu_strict_tid, pc, -3, nullptr);
        if (g.a >= S.tag_base && g.a != S.tag)
            report(write ? "global-memory race between blocks (write of what another block "
                           "updates atomically)"
                         : "global-memory race between blocks (read of what another block "
                           "updates atomically)",
                   "device heap", i * 2, emu_strict_tid, pc, -3, nullptr);
        if (write) {
            if (g.r >= S.tag_base && g.r != S.tag)
                report("global-memory race between blocks (write of what another block read)",
                       "device heap", i * 2, emu_strict_tid, pc, -3, nullptr);
            g.w = S.tag;
        } else {
            g.r = g.r >= S.tag_base && g.r != S.tag ? S.tag_base + S.nblocks : S.tag;
        }
    }
}

/* Atomics of several blocks on one word commute (up to rounding order): no conflict among
 * them; a plain access of another block is one (checked both ways). */
void gatomic(size_t off, size_t n, const void *pc) {
    if (!S.gs) return;
    fence(off, n, true, pc);
    for (size_t i = off / 2; i <= (off + n - 1) / 2; i++) {
        GlobShadow &g = S.gs[i];
        if ((g.w >= S.tag_base && g.w != S.tag) || (g.r >= S.tag_base && g.r != S.tag))
            report(g.w >= S.tag_base && g.w != S.tag
                       ? "global-memory race between blocks (atomic on what another block wrote)"
                       : "global-memory race between blocks (atomic on what another block read)",
                   "device heap", i * 2, emu_strict_tid, pc, -3, nullptr);
        g.a = g.a >= S.tag_base && g.a != S.tag ? S.tag_base + S.nblocks : S.tag;
    }
}

inline void access(const void *p, size_t n, bool write, const void *pc) {
    const char *c = (const char *)p;
    if (c >= S.heap && c < S.heap + S.heap_cap)
        gmem((size_t)(c - S.heap), n, write, pc);
    else if (c >= S.dyn && c < S.dyn + S.dyn_n)
        smem(S.dy, "dynamic shared memory", (size_t)(c - S.dyn), n, write, pc);
    else
        for (Array *a : S.cur)
            if (c >= a->lo && c < a->hi) {
                smem(a->sh, "static __shared__ array", (size_t)(c - a->lo), n, write, pc);
                break;
            }
}
} // namespace

extern "C" int emu_strict_enabled(void) {
    if (emu_strict_on < 0) {
        const char *e = getenv("EMU_STRICT");
        emu_strict_on = e && *e && strcmp(e, "0") != 0;
    }
    return emu_strict_on;
}

extern "C" void emu_strict_launch(const char *kernel, unsigned nblocks, char *dyn, size_t dyn_n,
                                  size_t smem_limit) {
    S.kernel = kernel;
    S.smem_limit = smem_limit, S.static_n = 0;
    S.tag_base += S.nblocks + 1; /* past the previous launch's tags and its several-readers tag */
    S.nblocks = nblocks;
    S.dyn = dyn, S.dyn_n = dyn_n;
    if (S.dy.size() < dyn_n / 2 + 1) S.dy.resize(dyn_n / 2 + 1);
    S.cur.clear();
    if (!S.gs) {
        emu_heap_bounds(&S.heap, &S.heap_cap);
        void *m = mmap(nullptr, S.heap_cap / 2 * sizeof(GlobShadow), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "emu strict: cannot map the global-memory shadow (%zu bytes)\n",
                    S.heap_cap / 2 * sizeof(GlobShadow));
            exit(3);
        }
        S.gs = (GlobShadow *)m;
    }
    if (S.tag_base > 0xF0000000u - nblocks) { /* block tags wrap: forget every launch so far */
        madvise(S.gs, S.heap_cap / 2 * sizeof(GlobShadow), MADV_DONTNEED);
        S.tag_base = 1;
    }
}

extern "C" void emu_strict_alloc(size_t cap, size_t off, size_t n, int live) {
    if (!emu_strict_enabled()) return;
    if (!S.live) {
        void *m = mmap(nullptr, cap / 8 + 1, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "emu strict: cannot map the heap's live-byte map (%zu bytes)\n",
                    cap / 8);
            exit(3);
        }
        S.live = (uint8_t *)m;
    }
    size_t i = off, end = off + n;
    for (; i < end && (i & 7); i++) /* head bits, whole bytes, tail bits */
        S.live[i >> 3] = live ? S.live[i >> 3] | (uint8_t)(1u << (i & 7))
                              : S.live[i >> 3] & (uint8_t) ~(1u << (i & 7));
    if (end - i >= 8) {
        memset(S.live + (i >> 3), live ? 0xFF : 0, (end - i) >> 3);
        i += (end - i) & ~(size_t)7;
    }
    for (; i < end; i++)
        S.live[i >> 3] = live ? S.live[i >> 3] | (uint8_t)(1u << (i & 7))
                              : S.live[i >> 3] & (uint8_t) ~(1u << (i & 7));
}

extern "C" void emu_strict_block(unsigned linear, unsigned bx, unsigned by, unsigned bz) {
    S.bx = bx, S.by = by, S.bz = bz;
    S.tag = S.tag_base + linear;
    S.epoch = S.block_start = ++S.counter;
    for (uint32_t &w : S.wepoch) w = ++S.counter;
}

namespace {
/* the static arrays of the running launch, with its dynamic buffer, fit a block's limit */
void check_static(size_t n) {
    S.static_n += n;
    if (S.static_n + S.dyn_n <= S.smem_limit) return;
    fprintf(stderr,
            "emu strict: kernel %s uses %zu bytes of static and %zu of dynamic shared memory per "
            "block: over the %zu KiB a block may have%s\n",
            S.kernel, S.static_n, S.dyn_n, S.smem_limit / 1024,
            S.smem_limit < 100 * 1024 ? " without opting in (cudaFuncSetAttribute)" : " on sm_90");
    exit(3);
}
} // namespace

extern "C" void emu_shared_reg(void *p, size_t n) {
    if (emu_strict_tid < 0) return;
    for (Array *a : S.cur)
        if (a->lo == (char *)p) return;
    check_static(n);
    for (Array &a : S.arrays)
        if (a.lo == (char *)p) {
            S.cur.push_back(&a);
            return;
        }
    S.arrays.reserve(256); /* S.cur points into it: it never reallocates */
    if (S.arrays.size() == 256) {
        fprintf(stderr, "emu strict: more than 256 static __shared__ arrays\n");
        exit(3);
    }
    S.arrays.push_back({(char *)p, (char *)p + n, std::vector<SmemShadow>(n / 2 + 1)});
    S.cur.push_back(&S.arrays.back());
}

extern "C" void emu_strict_atomic(void *p, size_t n, const void *pc) {
    const char *c = (const char *)p;
    if (emu_strict_tid >= 0 && c >= S.heap && c < S.heap + S.heap_cap)
        gatomic((size_t)(c - S.heap), n, pc);
}

/* A cp.async's destination, issued (pending: a write by this thread now, as the copy may land
 * at any time before its wait) or landed (pending cleared before the landing write). */
extern "C" void emu_strict_async(void *p, size_t n, int pending, const void *pc) {
    if (emu_strict_tid < 0) return;
    const char *c = (const char *)p;
    std::vector<SmemShadow> *sh = nullptr;
    const char *space = "dynamic shared memory";
    size_t off = 0;
    if (c >= S.dyn && c + n <= S.dyn + S.dyn_n) sh = &S.dy, off = (size_t)(c - S.dyn);
    for (Array *a : S.cur)
        if (!sh && c >= a->lo && c + n <= a->hi)
            sh = &a->sh, off = (size_t)(c - a->lo), space = "static __shared__ array";
    if (!sh) {
        fprintf(stderr,
                "emu strict: cp.async in kernel %s, thread %d at %s: destination %p is not "
                "shared memory of the block\n",
                S.kernel, emu_strict_tid, where(pc).c_str(), p);
        fflush(stderr);
        _exit(3);
    }
    if (pending) smem(*sh, space, off, n, true, pc);
    for (size_t i = off / 2; i <= (off + n - 1) / 2 && i < sh->size(); i++)
        (*sh)[i].pend = (int16_t)pending;
}

extern "C" void emu_strict_barrier(void) { S.epoch = ++S.counter; }
extern "C" void emu_strict_warp(int warp) { S.wepoch[warp] = ++S.counter; }

/* ---- the calls -fsanitize=thread inserts */
#define EMU_RW(n)                                                                                  \
    extern "C" void __tsan_read##n(void *p) {                                                      \
        if (emu_strict_tid >= 0) access(p, n, false, __builtin_return_address(0));                 \
    }                                                                                              \
    extern "C" void __tsan_write##n(void *p) {                                                     \
        if (emu_strict_tid >= 0) access(p, n, true, __builtin_return_address(0));                  \
    }                                                                                              \
    extern "C" void __tsan_unaligned_read##n(void *p) {                                            \
        if (emu_strict_tid >= 0) access(p, n, false, __builtin_return_address(0));                 \
    }                                                                                              \
    extern "C" void __tsan_unaligned_write##n(void *p) {                                           \
        if (emu_strict_tid >= 0) access(p, n, true, __builtin_return_address(0));                  \
    }
EMU_RW(1)
EMU_RW(2)
EMU_RW(4)
EMU_RW(8)
EMU_RW(16)
extern "C" void __tsan_read_range(void *p, size_t n) {
    if (emu_strict_tid >= 0 && n) access(p, n, false, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void *p, size_t n) {
    if (emu_strict_tid >= 0 && n) access(p, n, true, __builtin_return_address(0));
}
extern "C" void __tsan_init(void) {}
extern "C" void __tsan_func_entry(void *) {}
extern "C" void __tsan_func_exit(void) {}
/* the guard of a function-local static's initialisation */
extern "C" uint8_t __tsan_atomic8_load(const volatile uint8_t *a, int mo) {
    (void)mo;
    return __atomic_load_n(a, __ATOMIC_ACQUIRE);
}
