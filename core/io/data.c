/* data: shards -> one token stream -> fixed windows of T+1 tokens, optionally shuffled.
 * The stream is the sorted shards concatenated; a window may cross a shard boundary. The shuffle
 * is a keyed Feistel permutation over [0, S) with cycle-walking, so it costs no memory, is the
 * same under every layout, and each epoch (a new key) visits every window exactly once. */
#include "data.h"
#include "data_pack.h"
#include "fs.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rng.h"

#include <cjson/cJSON.h>

#define LLMC_MAGIC_U16 20240520
#define LLMC_MAGIC_U32 20240801
#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)
/* Version 2 is version 1 followed by the target mask: ceil(ntok / 8) bytes, bit i % 8 of byte
 * i / 8 set when token i is a target. A reader of version 1 only (llm.c's, an older ustrain's)
 * refuses it by its version check, never training on every token by mistake. */
#define LLMC_VERSION_MASK 2
#define EOT_TOKEN 256

typedef struct {
    char *path;
    void *map; /* whole file, read-only; NULL when the file is empty */
    size_t map_len;
    const unsigned char *tok;  /* first token */
    const unsigned char *mask; /* version 2: a bit per token (1: a target), LSB first; or NULL */
    int width;                 /* bytes per token: 2 or 4 */
    int64_t ntok;
    int64_t start;   /* index of its first token in the stream */
    struct stat st;  /* as opened: a later change (size, mtime, inode) stops the run */
    char *mask_path; /* Megatron: the PREFIX.mask sidecar the mask is mapped from, or NULL */
    void *mask_map;
    size_t mask_len;
    struct stat mask_st;
} shard;

struct ust_dataset {
    char pattern[UST_PATH_MAX];
    shard *shards;
    int nshards;
    int64_t ntok;
    int vocab_size;    /* token ids are checked again where they are read (<= 0: not checked) */
    bool has_mask;     /* some shard carries a target mask */
    data_packer *pack; /* data.packing: first_fit (NULL: windows cut from the stream) */
};

static inline uint32_t shard_token(const shard *s, int64_t i) {
    if (s->width == 2) {
        uint16_t v;
        memcpy(&v, s->tok + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, s->tok + 4 * i, 4);
    return v;
}

/* ---------------------------------------------------------------------------------------------
 * Opening */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Megatron-LM's indexed dataset (MMapIndexedDataset, as preprocess_data.py writes it): PREFIX.bin
 * holds the tokens of every sequence back to back; PREFIX.idx is the 9-byte magic "MMIDIDX\0\0",
 * a uint64 version (1), a uint8 dtype code, uint64 sequence and document counts, then int32
 * sizes[count] (tokens per sequence), int64 pointers[count] (byte offsets into .bin) and int64
 * doc_idx[docs]. The stream is the sequences in index order, so the index must describe the
 * .bin contiguously from byte 0 to its end. */
#define MEGATRON_MAGIC "MMIDIDX\0\0"
#define MEGATRON_HEADER 34 /* 9 + 8 + 1 + 8 + 8 */

static int megatron_width(int code) { return code == 8 ? 2 : code == 4 ? 4 : 0; }

/* PREFIX.mask beside PREFIX.bin (ustrain's; Megatron-LM has none): the target mask of its
 * tokens, "USTMASK\0", a uint64 version (1), a uint64 token count (the .bin's), then
 * ceil(count / 8) bytes, bit i % 8 of byte i / 8 set when token i is a target (the llm.c version
 * 2 bits). Without one every token is a target. */
#define MEGATRON_MASK_MAGIC "USTMASK\0"
#define MEGATRON_MASK_HEADER 24

static int open_megatron_mask(shard *s, const char *bin_path, ust_err *e) {
    char path[UST_PATH_MAX + 8];
    snprintf(path, sizeof path, "%.*s.mask", (int)strlen(bin_path) - 4, bin_path);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT) return 0;
    int fd = fs_open_regular(path, O_RDONLY, 0, e);
    if (fd < 0 || fstat(fd, &s->mask_st) != 0) {
        if (fd >= 0) close(fd);
        return fd < 0 ? -1 : ust_errf(e, "%s: cannot stat: %s", path, strerror(errno));
    }
    size_t size = (size_t)s->mask_st.st_size;
    if (size < MEGATRON_MASK_HEADER) {
        close(fd);
        return ust_errf(e, "%s: not a target mask (%zu bytes, shorter than its %d-byte header)",
                        path, size, MEGATRON_MASK_HEADER);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED) return ust_errf(e, "%s: cannot mmap: %s", path, strerror(err));
    s->mask_path = strdup(path), s->mask_map = map, s->mask_len = size;
    UST_ASSERT(s->mask_path, "out of memory");
    fs_guard_mapping(map, size, path);
    const unsigned char *h = map;
    uint64_t version, count, want = MEGATRON_MASK_HEADER + ((uint64_t)s->ntok + 7) / 8;
    memcpy(&version, h + 8, 8), memcpy(&count, h + 16, 8);
    if (memcmp(h, MEGATRON_MASK_MAGIC, 8) != 0 || version != 1)
        return ust_errf(e,
                        "%s: not a target mask (read: magic \"USTMASK\", version 1; got %zu "
                        "bytes, version %llu)",
                        path, size, (unsigned long long)version);
    if (count != (uint64_t)s->ntok || size != want)
        return ust_errf(e,
                        "%s: a mask of %llu tokens in %zu bytes, but %s holds %lld tokens (a mask "
                        "of them is %llu bytes)",
                        path, (unsigned long long)count, size, bin_path, (long long)s->ntok,
                        (unsigned long long)want);
    s->mask = h + MEGATRON_MASK_HEADER;
    return 0;
}

static int open_megatron_index(shard *s, const char *bin_path, size_t bin_size, ust_err *e) {
    char idx[UST_PATH_MAX + 8];
    size_t n = strlen(bin_path);
    if (n < 4 || strcmp(bin_path + n - 4, ".bin") != 0)
        return ust_errf(e, "%s: a Megatron dataset is named PREFIX.bin (with PREFIX.idx beside it)",
                        bin_path);
    snprintf(idx, sizeof idx, "%.*s.idx", (int)(n - 4), bin_path);
    ust_err inner;
    FILE *f = fs_fopen_regular(idx, "rb", &inner);
    if (!f) return ust_errf(e, "%s: cannot open its index: %s", bin_path, inner.msg);
    unsigned char h[MEGATRON_HEADER];
    int rc = -1;
    int32_t *sizes = NULL;
    int64_t *ptrs = NULL;
    uint64_t version, count, docs;
    if (fread(h, 1, sizeof h, f) != sizeof h || memcmp(h, MEGATRON_MAGIC, 9) != 0) {
        ust_errf(e, "%s: not a Megatron index (bad magic or shorter than its header)", idx);
        goto done;
    }
    memcpy(&version, h + 9, 8), memcpy(&count, h + 18, 8), memcpy(&docs, h + 26, 8);
    s->width = megatron_width(h[17]);
    if (version != 1 || !s->width) {
        ust_errf(e,
                 "%s: Megatron index version %llu, dtype code %d (read: version 1 with "
                 "uint16 (8) or int32 (4) tokens)",
                 idx, (unsigned long long)version, h[17]);
        goto done;
    }
    struct stat st;
    if (fstat(fileno(f), &st) || count > ((uint64_t)1 << 40) || docs > ((uint64_t)1 << 40) ||
        (uint64_t)st.st_size != MEGATRON_HEADER + 12 * count + 8 * docs) {
        ust_errf(e,
                 "%s: truncated or inconsistent Megatron index (%llu sequences, %llu documents "
                 "do not match its %lld bytes)",
                 idx, (unsigned long long)count, (unsigned long long)docs, (long long)st.st_size);
        goto done;
    }
    sizes = malloc((count ? count : 1) * sizeof *sizes);
    ptrs = malloc((count ? count : 1) * sizeof *ptrs);
    if (!sizes || !ptrs || fread(sizes, 4, count, f) != count ||
        fread(ptrs, 8, count, f) != count) {
        ust_errf(e, "%s: cannot read the Megatron index", idx);
        goto done;
    }
    int64_t next = 0;
    for (uint64_t i = 0; i < count; i++) {
        if (sizes[i] < 0) {
            ust_errf(e, "%s: sequence %llu has a negative size (%d tokens)", idx,
                     (unsigned long long)i, (int)sizes[i]);
            goto done;
        }
        if (ptrs[i] != next) {
            ust_errf(e,
                     "%s: sequence %llu starts at byte %lld, expected %lld (only contiguous "
                     "indexes are read)",
                     idx, (unsigned long long)i, (long long)ptrs[i], (long long)next);
            goto done;
        }
        next += (int64_t)sizes[i] * s->width;
    }
    if ((uint64_t)next != bin_size) {
        ust_errf(e, "%s: the index describes %lld bytes of tokens but the file has %zu", bin_path,
                 (long long)next, bin_size);
        goto done;
    }
    s->tok = s->map;
    s->ntok = next / s->width;
    rc = open_megatron_mask(s, bin_path, e);
done:
    free(sizes);
    free(ptrs);
    fclose(f);
    return rc;
}

/* An llm.c shard's header against its size: version 1, or 2 with the target mask after the
 * tokens. */
static int open_llmc(shard *s, const char *path, const unsigned char *base, size_t size,
                     ust_err *e) {
    if (size < LLMC_HEADER_BYTES)
        return ust_errf(e, "%s: not an llm.c shard (%zu bytes, shorter than the %d-byte header)",
                        path, size, LLMC_HEADER_BYTES);
    int32_t hdr[3];
    memcpy(hdr, base, sizeof hdr);
    if (hdr[0] == LLMC_MAGIC_U16)
        s->width = 2;
    else if (hdr[0] == LLMC_MAGIC_U32)
        s->width = 4;
    else
        return ust_errf(e, "%s: not an llm.c shard (magic %d; expected %d or %d)", path, hdr[0],
                        LLMC_MAGIC_U16, LLMC_MAGIC_U32);
    if (hdr[1] != 1 && hdr[1] != LLMC_VERSION_MASK)
        return ust_errf(e,
                        "%s: unsupported llm.c shard version %d (expected 1, or 2 with a "
                        "target mask)",
                        path, hdr[1]);
    if (hdr[2] < 0)
        return ust_errf(e, "%s: llm.c header has a negative token count (%d)", path, hdr[2]);
    int64_t mask_bytes = hdr[1] == LLMC_VERSION_MASK ? ((int64_t)hdr[2] + 7) / 8 : 0;
    int64_t want = LLMC_HEADER_BYTES + (int64_t)hdr[2] * s->width + mask_bytes;
    if ((int64_t)size != want)
        return ust_errf(e,
                        "%s: truncated shard: header says %d tokens%s (%lld bytes) but file "
                        "has %zu bytes",
                        path, hdr[2], mask_bytes ? " and their target mask" : "", (long long)want,
                        size);
    s->tok = base + LLMC_HEADER_BYTES;
    s->ntok = hdr[2];
    if (mask_bytes) s->mask = s->tok + (int64_t)hdr[2] * s->width;
    return 0;
}

/* Maps one shard and checks its header, its size and every token id. */
static int open_shard(shard *s, const char *path, ust_data_format fmt, int vocab_size, ust_err *e) {
    memset(s, 0, sizeof *s);
    s->path = strdup(path);
    if (!s->path) return ust_errf(e, "%s: out of memory", path);
    int fd = fs_open_regular(path, O_RDONLY, 0, e);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return ust_errf(e, "%s: cannot stat: %s", path, strerror(err));
    }
    s->st = st;
    size_t size = (size_t)st.st_size;
    if (size > 0) {
        s->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            int err = errno;
            s->map = NULL;
            close(fd);
            return ust_errf(e, "%s: cannot mmap: %s", path, strerror(err));
        }
        s->map_len = size;
        fs_guard_mapping(s->map, size, path);
    }
    close(fd);
    const unsigned char *base = s->map;

    if (fmt == DATA_LLMC) {
        if (open_llmc(s, path, base, size, e)) return -1;
    } else if (fmt == DATA_NANOGPT) {
        if (size % 2 != 0)
            return ust_errf(e, "%s: nanoGPT shard has an odd size (%zu bytes) for uint16 tokens",
                            path, size);
        s->width = 2;
        s->tok = base;
        s->ntok = (int64_t)(size / 2);
    } else if (fmt == DATA_MEGATRON) {
        if (open_megatron_index(s, path, size, e)) return -1;
    } else {
        return ust_errf(e, "%s: unknown data format %d", path, (int)fmt);
    }

    /* One linear pass: a token outside the vocabulary would index past the embedding. */
    if (vocab_size > 0) {
        for (int64_t i = 0; i < s->ntok; i++) {
            uint32_t v = shard_token(s, i);
            if (v >= (uint32_t)vocab_size)
                return ust_errf(e,
                                "%s: token %lld has id %u, outside the model's vocabulary "
                                "(vocab_size %d)",
                                path, (long long)i, v, vocab_size);
        }
    }
    return 0;
}

/* A glob that matched nothing may not have been able to look: glob skips a directory it cannot
 * open (too many open files, no permission). The directory before the first wildcard is tried,
 * so that the message says why instead of "no files match". */
static int explain_no_match(const char *pattern, ust_err *e) {
    char dir[UST_PATH_MAX];
    size_t wild = strcspn(pattern, "*?[");
    snprintf(dir, sizeof dir, "%.*s", (int)wild, pattern);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
    else
        snprintf(dir, sizeof dir, ".");
    DIR *d = opendir(dir);
    if (d) {
        closedir(d);
        return ust_errf(e, "data: no files match '%s'", pattern);
    }
    if (errno == ENOENT || errno == ENOTDIR)
        return ust_errf(e, "data: no files match '%s' (%s: %s)", pattern, dir, strerror(errno));
    return ust_errf(e, "data: cannot look for '%s': directory %s: %s", pattern, dir,
                    strerror(errno));
}

int data_open(ust_dataset **out, const char *glob_pattern, ust_data_format fmt, int vocab_size,
              ust_err *e) {
    *out = NULL;
    if (!glob_pattern || !glob_pattern[0]) return ust_errf(e, "data: empty shard pattern");
    glob_t g;
    int rc = glob(glob_pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        if (rc == 0) globfree(&g);
        return explain_no_match(glob_pattern, e);
    }
    if (rc != 0) return ust_errf(e, "data: cannot expand '%s' (glob error %d)", glob_pattern, rc);
    /* strcmp, not the locale's collation: the order must be the same on every machine. */
    qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), cmp_str);

    ust_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        globfree(&g);
        return ust_errf(e, "data: out of memory");
    }
    snprintf(d->pattern, sizeof d->pattern, "%s", glob_pattern);
    d->vocab_size = vocab_size;
    d->shards = calloc(g.gl_pathc, sizeof(shard));
    if (!d->shards) {
        globfree(&g);
        free(d);
        return ust_errf(e, "data: out of memory");
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        d->nshards = (int)i + 1;
        if (open_shard(&d->shards[i], g.gl_pathv[i], fmt, vocab_size, e) != 0) {
            globfree(&g);
            data_close(d);
            return -1;
        }
        d->shards[i].start = d->ntok;
        d->ntok += d->shards[i].ntok;
        d->has_mask |= d->shards[i].mask != NULL;
    }
    globfree(&g);
    *out = d;
    return 0;
}

void data_close(ust_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->nshards; i++) {
        if (d->shards[i].map) {
            fs_unguard_mapping(d->shards[i].map);
            munmap(d->shards[i].map, d->shards[i].map_len);
        }
        if (d->shards[i].mask_map) {
            fs_unguard_mapping(d->shards[i].mask_map);
            munmap(d->shards[i].mask_map, d->shards[i].mask_len);
        }
        free(d->shards[i].path);
        free(d->shards[i].mask_path);
    }
    free(d->shards);
    data_pack_free(d->pack);
    free(d);
}

int64_t data_num_tokens(const ust_dataset *d) { return d->ntok; }
int data_num_shards(const ust_dataset *d) { return d->nshards; }
bool data_has_mask(const ust_dataset *d) { return d->has_mask || d->pack; }

int64_t data_num_samples(const ust_dataset *d, int T) {
    if (d->pack) return data_pack_windows(d->pack);
    if (T < 1 || d->ntok < 1) return 0;
    return (d->ntok - 1) / T;
}

int data_check_seq_len(const ust_dataset *d, int T, ust_err *e) {
    if (T < 1) return ust_errf(e, "data: seq_len must be >= 1 (got %d)", T);
    if (d->ntok < (int64_t)T + 1)
        return ust_errf(e, "data: shard(s) '%s' hold %lld tokens, fewer than seq_len+1 = %d",
                        d->pattern, (long long)d->ntok, T + 1);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Sampling */

#define SHUFFLE_ROUNDS 6
#define SHUFFLE_STREAM 0x7368756666000000ull /* "shuff": keeps the keys apart from init's */

/* A bijection on [0, S): a balanced Feistel network on 2h bits (4^h >= S, so at most 4x the
 * domain) with cycle-walking: re-encrypt until the value lands in [0, S). Terminates because the
 * permutation's cycle through x must come back to x < S. */
static int64_t shuffle_index(uint64_t seed, uint64_t epoch, int64_t S, int64_t x) {
    if (S <= 1) return x;
    int h = 1;
    while (h < 32 && ((uint64_t)1 << (2 * h)) < (uint64_t)S) h++;
    uint64_t mask = ((uint64_t)1 << h) - 1;
    uint64_t key[SHUFFLE_ROUNDS];
    for (int r = 0; r < SHUFFLE_ROUNDS; r++) key[r] = rng_u64(seed, SHUFFLE_STREAM + epoch, r);
    uint64_t y = (uint64_t)x;
    do {
        uint64_t L = y >> h, R = y & mask;
        for (int r = 0; r < SHUFFLE_ROUNDS; r++) {
            uint64_t nl = R;
            R = L ^ (rng_u64(key[r], r, R) & mask);
            L = nl;
        }
        y = (L << h) | R;
    } while (y >= (uint64_t)S);
    return (int64_t)y;
}

/* A shard that changed since it was opened (rewritten in place, truncated, replaced) would feed
 * the run other tokens than a resume of it would see, or fault: the run stops, naming it. */
static void check_file_unchanged(const char *path, const struct stat *was) {
    struct stat now;
    if (stat(path, &now) != 0)
        ust_fatal(UST_EXIT_RUNTIME, "data shard %s is gone while the run reads it: %s", path,
                  strerror(errno));
    if (now.st_ino != was->st_ino || now.st_dev != was->st_dev || now.st_size != was->st_size ||
        now.st_mtim.tv_sec != was->st_mtim.tv_sec || now.st_mtim.tv_nsec != was->st_mtim.tv_nsec)
        ust_fatal(UST_EXIT_RUNTIME,
                  "data shard %s changed while the run reads it (size %lld -> %lld bytes, "
                  "modified again at %lld): shards must not be rewritten during a run; "
                  "checkpoints already written are intact",
                  path, (long long)was->st_size, (long long)now.st_size,
                  (long long)now.st_mtim.tv_sec);
}

static void check_unchanged(const shard *sh) {
    check_file_unchanged(sh->path, &sh->st);
    if (sh->mask_path) check_file_unchanged(sh->mask_path, &sh->mask_st);
}

static int32_t checked_token(const ust_dataset *d, const shard *sh, int64_t i) {
    uint32_t v = shard_token(sh, i);
    if (d->vocab_size > 0 && v >= (uint32_t)d->vocab_size)
        ust_fatal(UST_EXIT_RUNTIME,
                  "data shard %s: token %lld has id %u, outside the model's vocabulary "
                  "(vocab_size %d): the shard changed while the run read it",
                  sh->path, (long long)i, v, d->vocab_size);
    return (int32_t)v;
}

/* The last shard with start <= pos. */
static int shard_at(const ust_dataset *d, int64_t pos) {
    int lo = 0, hi = d->nshards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->shards[mid].start <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Copies the target flags of n tokens of the stream starting at pos (1 for a shard without a
 * mask: every token a target). */
static void copy_mask(const ust_dataset *d, int64_t pos, int64_t n, uint8_t *out) {
    for (int s = shard_at(d, pos); n > 0 && s < d->nshards; s++) {
        const shard *sh = &d->shards[s];
        int64_t i = pos - sh->start;
        if (i < sh->ntok) check_unchanged(sh);
        for (; i < sh->ntok && n > 0; i++, n--, pos++)
            *out++ = sh->mask ? (sh->mask[i >> 3] >> (i & 7)) & 1 : 1;
    }
    UST_ASSERT(n == 0, "window ran past the stream end (%lld tokens short)", (long long)n);
}

/* Copies n tokens of the stream starting at pos, across shard boundaries. */
static void copy_tokens(const ust_dataset *d, int64_t pos, int64_t n, int32_t *out) {
    for (int s = shard_at(d, pos); n > 0 && s < d->nshards; s++) {
        const shard *sh = &d->shards[s];
        int64_t i = pos - sh->start;
        if (i < sh->ntok) check_unchanged(sh);
        for (; i < sh->ntok && n > 0; i++, n--, pos++) *out++ = checked_token(d, sh, i);
    }
    UST_ASSERT(n == 0, "window ran past the stream end (%lld tokens short)", (long long)n);
}

/* The stream position of global sample g's window. */
static int64_t window_start(const ust_dataset *d, int64_t g, int T, bool shuffle, uint64_t seed) {
    int64_t S = data_num_samples(d, T);
    if (S <= 0)
        ust_fatal(UST_EXIT_USAGE, "data: shard(s) '%s' hold %lld tokens, fewer than seq_len+1 = %d",
                  d->pattern, (long long)d->ntok, T + 1);
    UST_ASSERT(g >= 0, "sample %lld", (long long)g);
    int64_t epoch = g / S, i = g % S;
    return (shuffle ? shuffle_index(seed, (uint64_t)epoch, S, i) : i) * (int64_t)T;
}

void data_read_tokens(const ust_dataset *d, int64_t pos, int64_t n, int32_t *out) {
    copy_tokens(d, pos, n, out);
}

void data_read_flags(const ust_dataset *d, int64_t pos, int64_t n, uint8_t *out) {
    copy_mask(d, pos, n, out);
}

/* Packed: sample g is window perm(g) of the packer's (the same permutation as the stream's). */
static int64_t packed_window(const ust_dataset *d, int64_t g, bool shuffle, uint64_t seed) {
    int64_t S = data_pack_windows(d->pack), epoch = g / S, i = g % S;
    return shuffle ? shuffle_index(seed, (uint64_t)epoch, S, i) : i;
}

int data_pack(ust_dataset *d, int T, int eot, int buffer, bool drop, data_pack_stats *st,
              ust_err *e) {
    data_pack_free(d->pack);
    d->pack = NULL;
    data_packer *p;
    if (data_pack_build(&p, d, T, eot, buffer, drop, st, e)) return -1;
    d->pack = p;
    return 0;
}

void data_get_samples(const ust_dataset *d, int64_t first, int n, int T, bool shuffle,
                      uint64_t seed, int32_t *out) {
    for (int k = 0; k < n && d->pack; k++)
        data_pack_window(d->pack, d, packed_window(d, first + k, shuffle, seed),
                         out + (int64_t)k * (T + 1), NULL);
    for (int k = 0; k < n && !d->pack; k++)
        copy_tokens(d, window_start(d, first + k, T, shuffle, seed), (int64_t)T + 1,
                    out + (int64_t)k * (T + 1));
}

void data_get_masks(const ust_dataset *d, int64_t first, int n, int T, bool shuffle, uint64_t seed,
                    uint8_t *out) {
    for (int k = 0; k < n && d->pack; k++)
        data_pack_window(d->pack, d, packed_window(d, first + k, shuffle, seed), NULL,
                         out + (int64_t)k * (T + 1));
    for (int k = 0; k < n && !d->pack; k++)
        copy_mask(d, window_start(d, first + k, T, shuffle, seed), (int64_t)T + 1,
                  out + (int64_t)k * (T + 1));
}

/* ---------------------------------------------------------------------------------------------
 * Writing shards */

static int write_all(FILE *f, const void *p, size_t n, const char *path, ust_err *e) {
    if (n && fwrite(p, 1, n, f) != n)
        return ust_errf(e, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

static int llmc_header(int32_t hdr[LLMC_HEADER_INTS], int width, int64_t n, const char *path,
                       ust_err *e) {
    if (n > INT32_MAX)
        return ust_errf(e, "%s: %lld tokens do not fit one llm.c shard (at most %d)", path,
                        (long long)n, INT32_MAX);
    memset(hdr, 0, LLMC_HEADER_BYTES);
    hdr[0] = width == 2 ? LLMC_MAGIC_U16 : LLMC_MAGIC_U32;
    hdr[1] = 1;
    hdr[2] = (int32_t)n;
    return 0;
}

int data_llmc_header(int32_t hdr[256], int width, int64_t ntok, const char *path, ust_err *e) {
    return llmc_header(hdr, width, ntok, path, e);
}

int data_llmc_header_mask(int32_t hdr[256], int width, int64_t ntok, const char *path, ust_err *e) {
    if (llmc_header(hdr, width, ntok, path, e)) return -1;
    hdr[1] = LLMC_VERSION_MASK;
    return 0;
}

void data_pack_mask(const uint8_t *flags, int64_t n, uint8_t *bits) {
    memset(bits, 0, (size_t)((n + 7) / 8));
    for (int64_t i = 0; i < n; i++) bits[i >> 3] |= (uint8_t)((flags[i] != 0) << (i & 7));
}

static int close_file(FILE *f, const char *path, ust_err *e) {
    if (fclose(f) != 0) return ust_errf(e, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int data_write_llmc_shard(const char *path, const int32_t *tokens, int64_t n, ust_err *e) {
    return data_write_llmc_shard_mask(path, tokens, NULL, n, e);
}

int data_write_llmc_shard_mask(const char *path, const int32_t *tokens, const uint8_t *mask,
                               int64_t n, ust_err *e) {
    int32_t maxv = 0;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0)
            return ust_errf(e, "%s: token %lld is negative (%d)", path, (long long)i, tokens[i]);
        if (tokens[i] > maxv) maxv = tokens[i];
    }
    int width = maxv < 65536 ? 2 : 4;
    int32_t hdr[LLMC_HEADER_INTS];
    if (llmc_header(hdr, width, n, path, e) != 0) return -1;
    if (mask) hdr[1] = LLMC_VERSION_MASK;
    /* written under a temporary name and renamed: a FIFO or symlink at path is replaced, never
     * opened or followed, and a reader of the old shard keeps its file */
    char tmp[UST_PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return ust_errf(e, "%s: path too long", path);
    unlink(tmp);
    int fd = fs_open_regular(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666, e);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) {
        if (fd >= 0) close(fd);
        return fd < 0 ? -1 : ust_errf(e, "%s: cannot create: %s", tmp, strerror(errno));
    }
    int rc = write_all(f, hdr, LLMC_HEADER_BYTES, path, e);
    enum { CHUNK = 8192 };
    uint16_t buf16[CHUNK];
    for (int64_t i = 0; rc == 0 && i < n; i += CHUNK) {
        int64_t m = n - i < CHUNK ? n - i : CHUNK;
        if (width == 2) {
            for (int64_t j = 0; j < m; j++) buf16[j] = (uint16_t)tokens[i + j];
            rc = write_all(f, buf16, (size_t)m * 2, path, e);
        } else {
            rc = write_all(f, tokens + i, (size_t)m * 4, path, e); /* little-endian host */
        }
    }
    uint8_t *bits = mask ? malloc((size_t)((n + 7) / 8) + 1) : NULL;
    UST_ASSERT(!mask || bits, "out of memory (%lld tokens' mask)", (long long)n);
    if (mask) data_pack_mask(mask, n, bits);
    if (rc == 0 && mask) rc = write_all(f, bits, (size_t)((n + 7) / 8), path, e);
    free(bits);
    if (close_file(f, path, e) != 0) rc = -1;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = ust_errf(e, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc != 0) unlink(tmp);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Demo data: generated English-like text. A small grammar with agreement (the cat sees / the
 * cats see), fixed templates, counting runs and small sums gives a tiny model structure to
 * learn quickly at every level: spelling, word order, agreement, and the number sequence. */

static const char *const NOUNS[] = {
    "cat",  "dog",   "bird",   "fish",   "fox",   "cow",    "horse",  "sheep",  "goat",    "duck",
    "frog", "bear",  "mouse",  "rabbit", "lion",  "tiger",  "wolf",   "owl",    "hen",     "pig",
    "ant",  "bee",   "snake",  "ball",   "box",   "cup",    "hat",    "book",   "car",     "boat",
    "tree", "house", "door",   "window", "chair", "table",  "bed",    "lamp",   "clock",   "key",
    "coat", "shoe",  "bag",    "pen",    "apple", "cake",   "egg",    "stone",  "flower",  "river",
    "hill", "road",  "garden", "field",  "farm",  "bridge", "ship",   "train",  "kite",    "drum",
    "bell", "star",  "cloud",  "leaf",   "seed",  "nest",   "basket", "bottle", "spoon",   "plate",
    "rope", "wheel", "candle", "letter", "song",  "game",   "friend", "child",  "teacher", "farmer",
    "king", "queen", "baker",  "sailor", "doctor"};
static const char *const ADJS[] = {
    "small",  "big",   "red",   "blue",   "green",  "yellow", "old",   "new",   "happy",
    "sad",    "quick", "slow",  "tall",   "short",  "warm",   "cold",  "soft",  "hard",
    "bright", "dark",  "loud",  "quiet",  "clean",  "dirty",  "round", "flat",  "long",
    "young",  "brave", "kind",  "funny",  "sleepy", "hungry", "busy",  "tiny",  "huge",
    "wet",    "dry",   "sweet", "pretty", "strong", "gentle", "white", "black", "brown",
    "pink",   "shiny", "heavy", "light",  "wild",   "calm",   "proud"};
static const char *const VERBS[] = {/* transitive, regular third person: +s */
                                    "see",   "like",  "find",  "want",  "hold",  "help", "follow",
                                    "watch", "bring", "take",  "keep",  "make",  "love", "hear",
                                    "pull",  "push",  "carry", "move",  "paint", "draw", "open",
                                    "close", "fix",   "wash",  "catch", "touch", "kick", "throw",
                                    "read",  "build", "visit", "call",  "chase", "feed", "meet",
                                    "greet", "hide",  "lift",  "drop",  "count"};
static const char *const IVERBS[] = {/* intransitive */
                                     "sleeps", "runs",   "jumps",  "sings",  "plays", "waits",
                                     "sits",   "walks",  "swims",  "smiles", "rests", "dances",
                                     "hides",  "laughs", "shouts", "works"};
static const char *const PREPS[] = {"on", "under", "near", "behind", "beside",
                                    "in", "over",  "by",   "with",   "inside"};
static const char *const PLACES[] = {"the garden", "the house",  "the field", "the river",
                                     "the farm",   "the park",   "the town",  "the forest",
                                     "the market", "the school", "the hill",  "the road"};
static const char *const TIMES[] = {"in the morning", "at night",  "every day",     "after lunch",
                                    "before dinner",  "on sunday", "in the spring", "in the winter",
                                    "today",          "yesterday"};
static const char *const NAMES[] = {"Anna",  "Ben",  "Clara", "David", "Emma", "Felix", "Grace",
                                    "Henry", "Iris", "Jack",  "Kate",  "Leo",  "Mia",   "Noah",
                                    "Olive", "Paul", "Rose",  "Sam",   "Tom",  "Zoe"};
static const char *const NUMS[] = {
    "zero",     "one",     "two",     "three",     "four",     "five",     "six",
    "seven",    "eight",   "nine",    "ten",       "eleven",   "twelve",   "thirteen",
    "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    int32_t *tok;
    int64_t n, cap;
    uint64_t seed, stream, ctr; /* counter-based draws: the text is a pure function of these */
    int sentence_start;         /* capitalize the next letter */
} demo_gen;

static int dg_pick(demo_gen *g, int n) {
    return (int)(rng_u64(g->seed, g->stream, g->ctr++) % (uint64_t)n);
}

static void dg_put(demo_gen *g, int32_t t) {
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 1 << 16;
        g->tok = realloc(g->tok, (size_t)g->cap * sizeof(int32_t));
        UST_ASSERT(g->tok, "out of memory (%lld tokens)", (long long)g->cap);
    }
    g->tok[g->n++] = t;
}

static void dg_str(demo_gen *g, const char *s) {
    for (; *s; s++) {
        int c = (unsigned char)*s;
        if (g->sentence_start && c >= 'a' && c <= 'z') {
            c += 'A' - 'a';
            g->sentence_start = 0;
        }
        dg_put(g, c);
    }
}

/* A word, preceded by a space unless it starts the paragraph or follows a space already. */
static void dg_word(demo_gen *g, const char *w) {
    if (g->n > 0 && g->tok[g->n - 1] != ' ' && g->tok[g->n - 1] != EOT_TOKEN) dg_put(g, ' ');
    dg_str(g, w);
}

static void dg_end(demo_gen *g, const char *punct) {
    dg_str(g, punct);
    g->sentence_start = 1;
}

/* "cat" -> "cats", "fox" -> "foxes", "sheep" -> "sheep", "child" -> "children" ... */
static void plural(char *out, size_t sz, const char *w) {
    static const char *const irr[][2] = {{"sheep", "sheep"}, {"fish", "fish"},
                                         {"mouse", "mice"},  {"child", "children"},
                                         {"leaf", "leaves"}, {"goose", "geese"}};
    for (int i = 0; i < NELEM(irr); i++)
        if (!strcmp(w, irr[i][0])) {
            snprintf(out, sz, "%s", irr[i][1]);
            return;
        }
    size_t n = strlen(w);
    if (n >= 2 && (w[n - 1] == 'x' || w[n - 1] == 's' || (w[n - 2] == 'c' && w[n - 1] == 'h') ||
                   (w[n - 2] == 's' && w[n - 1] == 'h')))
        snprintf(out, sz, "%ses", w);
    else
        snprintf(out, sz, "%ss", w);
}

/* Third person singular: same rules as the noun plural for these regular verbs. */
static void third_person(char *out, size_t sz, const char *v) {
    size_t n = strlen(v);
    if (n >= 2 && (v[n - 1] == 'x' || v[n - 1] == 's' || (v[n - 2] == 'c' && v[n - 1] == 'h') ||
                   (v[n - 2] == 's' && v[n - 1] == 'h')))
        snprintf(out, sz, "%ses", v);
    else if (n >= 2 && v[n - 1] == 'y' && !strchr("aeiou", v[n - 2]))
        snprintf(out, sz, "%.*sies", (int)(n - 1), v);
    else
        snprintf(out, sz, "%ss", v);
}

/* "the [adj] noun(s)" or "a/an [adj] noun"; returns whether it is plural. */
static int dg_noun_phrase(demo_gen *g, const char *det) {
    int pl = dg_pick(g, 3) == 0;
    const char *adj = dg_pick(g, 2) ? ADJS[dg_pick(g, NELEM(ADJS))] : NULL;
    const char *n = NOUNS[dg_pick(g, NELEM(NOUNS))];
    if (!strcmp(det, "a")) {
        const char *first = adj ? adj : n;
        det = pl ? "some" : strchr("aeiou", first[0]) ? "an" : "a";
    }
    dg_word(g, det);
    if (adj) dg_word(g, adj);
    char buf[32];
    if (pl) {
        plural(buf, sizeof buf, n);
        dg_word(g, buf);
    } else {
        dg_word(g, n);
    }
    return pl;
}

/* the small cat sees a red ball. */
static void dg_transitive(demo_gen *g) {
    char buf[32];
    int pl = dg_noun_phrase(g, "the");
    const char *v = VERBS[dg_pick(g, NELEM(VERBS))];
    if (pl)
        dg_word(g, v);
    else {
        third_person(buf, sizeof buf, v);
        dg_word(g, buf);
    }
    dg_noun_phrase(g, dg_pick(g, 2) ? "a" : "the");
    if (dg_pick(g, 3) == 0) dg_word(g, TIMES[dg_pick(g, NELEM(TIMES))]);
    dg_end(g, ".");
}

/* the dogs are happy. */
static void dg_copula(demo_gen *g) {
    int pl = dg_noun_phrase(g, "the");
    dg_word(g, pl ? "are" : "is");
    dg_word(g, ADJS[dg_pick(g, NELEM(ADJS))]);
    dg_end(g, ".");
}

/* the old fox sleeps near the tree. */
static void dg_intransitive(demo_gen *g) {
    char buf[32];
    int pl = dg_noun_phrase(g, "the");
    const char *v = IVERBS[dg_pick(g, NELEM(IVERBS))];
    if (pl) {
        snprintf(buf, sizeof buf, "%.*s", (int)strlen(v) - 1, v);
        dg_word(g, buf);
    } else {
        dg_word(g, v);
    }
    dg_word(g, PREPS[dg_pick(g, NELEM(PREPS))]);
    dg_noun_phrase(g, "the");
    dg_end(g, ".");
}

/* one, two, three, four, five. */
static void dg_counting(demo_gen *g) {
    int a = dg_pick(g, 12), len = 3 + dg_pick(g, 6);
    if (a + len > NELEM(NUMS)) len = NELEM(NUMS) - a;
    for (int i = 0; i < len; i++) {
        dg_word(g, NUMS[a + i]);
        if (i + 1 < len) dg_str(g, ",");
    }
    dg_end(g, ".");
}

/* two plus three is five. */
static void dg_sum(demo_gen *g) {
    int a = dg_pick(g, 11), b = dg_pick(g, 11 - a); /* a + b <= 10 */
    dg_word(g, NUMS[a]);
    dg_word(g, "plus");
    dg_word(g, NUMS[b]);
    dg_word(g, "is");
    dg_word(g, NUMS[a + b]);
    dg_end(g, ".");
}

/* Anna has three red apples. */
static void dg_has(demo_gen *g) {
    char buf[32];
    dg_word(g, NAMES[dg_pick(g, NELEM(NAMES))]);
    dg_word(g, "has");
    int k = 2 + dg_pick(g, 9);
    dg_word(g, NUMS[k]);
    if (dg_pick(g, 2)) dg_word(g, ADJS[dg_pick(g, NELEM(ADJS))]);
    plural(buf, sizeof buf, NOUNS[dg_pick(g, NELEM(NOUNS))]);
    dg_word(g, buf);
    dg_end(g, ".");
}

/* Ben gives the cup to Mia near the garden. */
static void dg_gives(demo_gen *g) {
    int a = dg_pick(g, NELEM(NAMES)), b = (a + 1 + dg_pick(g, NELEM(NAMES) - 1)) % NELEM(NAMES);
    dg_word(g, NAMES[a]);
    dg_word(g, "gives");
    dg_noun_phrase(g, "the");
    dg_word(g, "to");
    dg_word(g, NAMES[b]);
    dg_word(g, "near");
    dg_word(g, PLACES[dg_pick(g, NELEM(PLACES))]);
    dg_end(g, ".");
}

/* where is the cat? the cat is in the house. */
static void dg_where_is(demo_gen *g) {
    const char *n = NOUNS[dg_pick(g, NELEM(NOUNS))];
    const char *p = PLACES[dg_pick(g, NELEM(PLACES))];
    dg_word(g, "where");
    dg_word(g, "is");
    dg_word(g, "the");
    dg_word(g, n);
    dg_end(g, "?");
    dg_word(g, "the");
    dg_word(g, n);
    dg_word(g, "is");
    dg_word(g, "in");
    dg_word(g, p);
    dg_end(g, ".");
}

/* One sentence of a kind picked at random; the transitive kind twice as often as the others. */
static void dg_sentence(demo_gen *g) {
    static void (*const kinds[9])(demo_gen *) = {dg_transitive,   dg_transitive, dg_copula,
                                                 dg_intransitive, dg_counting,   dg_sum,
                                                 dg_has,          dg_gives,      dg_where_is};
    kinds[dg_pick(g, 9)](g);
}

/* Paragraphs of 3..8 sentences, each followed by the end-of-text token, until >= ntok tokens. */
static void dg_generate(demo_gen *g, int64_t ntok) {
    while (g->n < ntok) {
        g->sentence_start = 1;
        int ns = 3 + dg_pick(g, 6);
        for (int i = 0; i < ns; i++) dg_sentence(g);
        dg_put(g, EOT_TOKEN);
    }
}

/* Cuts at the first end-of-text at or after `at`, so no paragraph straddles two files. */
static int64_t dg_cut(const demo_gen *g, int64_t at) {
    while (at < g->n && g->tok[at - 1] != EOT_TOKEN) at++;
    return at;
}

int data_write_demo(const char *dir, ust_err *e) {
    if (fs_mkdir_p(dir, e) != 0) return -1;
    const uint64_t seed = 20240520;
    demo_gen tr = {.seed = seed, .stream = 1}, va = {.seed = seed, .stream = 2};
    dg_generate(&tr, 1200000);
    dg_generate(&va, 100000);
    int64_t cut = dg_cut(&tr, tr.n / 2);
    char path[UST_PATH_MAX + 32];
    int rc = 0;
    snprintf(path, sizeof path, "%s/train_000.bin", dir);
    if (rc == 0) rc = data_write_llmc_shard(path, tr.tok, cut, e);
    snprintf(path, sizeof path, "%s/train_001.bin", dir);
    if (rc == 0) rc = data_write_llmc_shard(path, tr.tok + cut, tr.n - cut, e);
    snprintf(path, sizeof path, "%s/val_000.bin", dir);
    if (rc == 0) rc = data_write_llmc_shard(path, va.tok, va.n, e);
    free(tr.tok);
    free(va.tok);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * meta.json */

/* An integer field in [-1, 2^31): absent or null is -1. */
static int meta_int(const cJSON *j, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *out = -1;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return -1;
    *out = (int)v->valuedouble;
    return 0;
}

/* A string field into out (cap bytes): absent or null is "". */
static int meta_string(const cJSON *j, const char *key, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    out[0] = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return -1;
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

int data_meta_read(const char *glob_pattern, data_meta *out, ust_err *e) {
    const char *slash = strrchr(glob_pattern, '/');
    int dir_len = slash ? (int)(slash - glob_pattern) : 1;
    snprintf(out->path, sizeof out->path, "%.*s/meta.json", dir_len, slash ? glob_pattern : ".");
    out->vocab_size = out->eot_id = -1;
    out->tokenizer[0] = out->tokenizer_sha256[0] = 0;
    if (access(out->path, F_OK) != 0 && errno == ENOENT) return 0;
    char *buf = fs_read_file(out->path, 1 << 20, NULL, e); /* data prep writes ~300 bytes */
    if (!buf) return -1;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    int rc = j && cJSON_IsObject(j) && !meta_int(j, "vocab_size", &out->vocab_size) &&
                     !meta_int(j, "eot_id", &out->eot_id) &&
                     !meta_string(j, "tokenizer", out->tokenizer, sizeof out->tokenizer) &&
                     !meta_string(j, "tokenizer_sha256", out->tokenizer_sha256,
                                  sizeof out->tokenizer_sha256)
                 ? 1
                 : ust_errf(e,
                            "%s: not a data prep meta.json (vocab_size, eot_id: whole numbers; "
                            "tokenizer, tokenizer_sha256: strings)",
                            out->path);
    cJSON_Delete(j);
    return rc;
}
