/* data: shard formats and their validation, the window order, the shuffle's permutation
 * property, the demo data and byte-level preparation. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "prep.h"
#include "test.h"

static char g_tmp[256];

static void path_in(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_tmp, name);
}

static void write_raw(const char *name, const void *p, size_t n) {
    char path[512];
    path_in(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void mkdir_in(char *out, size_t n, const char *name) {
    path_in(out, n, name);
    mkdir(out, 0755);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Three shards of 10, 7 and 13 tokens; token k of the stream is 3*k + 1 (shard 2 in uint32
 * with a large id, so it has to be the uint32 format). */
#define NTOK 30
static int32_t stream_tok(int64_t k) { return k == 25 ? 70000 : (int32_t)(3 * k + 1); }

static int make_three_shards(char *dir, size_t n) {
    mkdir_in(dir, n, "three");
    int32_t t[NTOK];
    for (int k = 0; k < NTOK; k++) t[k] = stream_tok(k);
    ust_err e;
    char p[600];
    snprintf(p, sizeof p, "%s/s_000.bin", dir);
    if (data_write_llmc_shard(p, t, 10, &e)) return -1;
    snprintf(p, sizeof p, "%s/s_001.bin", dir);
    if (data_write_llmc_shard(p, t + 10, 7, &e)) return -1;
    snprintf(p, sizeof p, "%s/s_002.bin", dir);
    if (data_write_llmc_shard(p, t + 17, 13, &e)) return -1;
    return 0;
}

/* Text -> byte-level shards (ids 0..255, end of text 256) with one thread: prep_run without a
 * tokenizer. */
static int prep_bytes(prep_args *a, ust_err *e) {
    a->eot = PREP_EOT_DEFAULT;
    a->threads = 1;
    return prep_run(a, NULL, e);
}

static void test_llmc_shard_width_follows_max_token(void) {
    char dir[512], p[600];
    CHECK(make_three_shards(dir, sizeof dir) == 0, "writing shards failed");
    snprintf(p, sizeof p, "%s/s_000.bin", dir);
    CHECK(file_size(p) == 1024 + 10 * 2, "uint16 shard size %ld", file_size(p));
    snprintf(p, sizeof p, "%s/s_002.bin", dir);
    CHECK(file_size(p) == 1024 + 13 * 4, "uint32 shard size %ld", file_size(p));
    FILE *f = fopen(p, "rb");
    int32_t hdr[3];
    CHECK(fread(hdr, 4, 3, f) == 3, "short read");
    fclose(f);
    CHECK(hdr[0] == 20240801 && hdr[1] == 1 && hdr[2] == 13, "header %d %d %d", hdr[0], hdr[1],
          hdr[2]);
}

static void test_windows_without_shuffle_cross_shard_boundaries(void) {
    char dir[512], pat[600];
    CHECK(make_three_shards(dir, sizeof dir) == 0, "writing shards failed");
    snprintf(pat, sizeof pat, "%s/s_*.bin", dir);
    ust_dataset *d;
    ust_err e;
    CHECK(data_open(&d, pat, DATA_LLMC, 100000, &e) == 0, "open: %.900s", e.msg);
    CHECK(data_num_shards(d) == 3 && data_num_tokens(d) == NTOK, "%d shards, %lld tokens",
          data_num_shards(d), (long long)data_num_tokens(d));
    const int T = 4;
    int64_t S = data_num_samples(d, T);
    CHECK(S == (NTOK - 1) / T, "S = %lld", (long long)S);
    /* all windows of two epochs in one call: epoch 2 repeats epoch 1 without shuffle */
    int32_t out[2 * 7 * 5];
    data_get_samples(d, 0, (int)(2 * S), T, false, 1, out);
    for (int64_t g = 0; g < 2 * S; g++)
        for (int j = 0; j <= T; j++) {
            int64_t k = (g % S) * T + j;
            CHECK(out[g * (T + 1) + j] == stream_tok(k), "sample %lld token %d: %d != %d",
                  (long long)g, j, out[g * (T + 1) + j], stream_tok(k));
        }
    /* starting mid-stream gives the same windows */
    int32_t one[5];
    data_get_samples(d, 3, 1, T, false, 1, one);
    CHECK(!memcmp(one, out + 3 * (T + 1), sizeof one), "sample 3 differs when fetched alone");
    CHECK(data_check_seq_len(d, T, &e) == 0, "check_seq_len: %.900s", e.msg);
    CHECK(data_check_seq_len(d, NTOK, &e) == -1 && strstr(e.msg, "fewer than seq_len+1"),
          "seq_len %d accepted for %d tokens: %.900s", NTOK, NTOK, e.msg);
    data_close(d);
}

/* Target masks: a version-2 shard (uint16 and uint32) and a version-1 shard (every token a
 * target) in one stream; the flags of each window follow the tokens across the boundaries. */
static void test_target_mask_follows_the_windows_across_shards(void) {
    char dir[512], p[600];
    mkdir_in(dir, sizeof dir, "masked");
    int32_t t[NTOK];
    uint8_t m[NTOK];
    for (int k = 0; k < NTOK; k++) t[k] = stream_tok(k), m[k] = k < 17 ? (k * 7) % 3 == 0 : 1;
    ust_err e;
    snprintf(p, sizeof p, "%s/s_000.bin", dir);
    CHECK(data_write_llmc_shard_mask(p, t, m, 10, &e) == 0, "%.900s", e.msg);
    CHECK(file_size(p) == 1024 + 10 * 2 + 2, "masked uint16 shard size %ld", file_size(p));
    snprintf(p, sizeof p, "%s/s_001.bin", dir);
    CHECK(data_write_llmc_shard_mask(p, t + 10, m + 10, 7, &e) == 0, "%.900s", e.msg);
    snprintf(p, sizeof p, "%s/s_002.bin", dir);
    CHECK(data_write_llmc_shard(p, t + 17, 13, &e) == 0, "%.900s", e.msg);
    snprintf(p, sizeof p, "%s/s_*.bin", dir);
    ust_dataset *d;
    CHECK(data_open(&d, p, DATA_LLMC, 100000, &e) == 0, "open: %.900s", e.msg);
    CHECK(data_has_mask(d), "the masked shards are not seen as such");
    const int T = 4;
    int64_t S = data_num_samples(d, T);
    uint8_t f[7 * 5];
    int32_t w[7 * 5];
    data_get_masks(d, 0, (int)S, T, false, 1, f);
    data_get_samples(d, 0, (int)S, T, false, 1, w);
    for (int64_t g = 0; g < S; g++)
        for (int j = 0; j <= T; j++) {
            int64_t k = g * T + j;
            CHECK(f[g * (T + 1) + j] == m[k] && w[g * (T + 1) + j] == t[k],
                  "window %lld token %d: flag %d (want %d)", (long long)g, j, f[g * (T + 1) + j],
                  m[k]);
        }
    data_close(d);
    /* without a masked shard: no mask */
    CHECK(make_three_shards(dir, sizeof dir) == 0, "writing shards failed");
    snprintf(p, sizeof p, "%s/s_*.bin", dir);
    CHECK(data_open(&d, p, DATA_LLMC, 100000, &e) == 0, "open: %.900s", e.msg);
    CHECK(!data_has_mask(d), "version-1 shards seen as masked");
    data_close(d);
}

static void test_shuffle_is_a_permutation_per_epoch_and_seeded(void) {
    /* 1001 tokens: S = 1000 windows of T=1, and window w starts with token w. */
    char dir[512], p[600], pat[600];
    mkdir_in(dir, sizeof dir, "perm");
    int32_t t[1001];
    for (int k = 0; k < 1001; k++) t[k] = k;
    ust_err e;
    snprintf(p, sizeof p, "%s/a.bin", dir);
    CHECK(data_write_llmc_shard(p, t, 1001, &e) == 0, "%.900s", e.msg);
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    ust_dataset *d;
    CHECK(data_open(&d, pat, DATA_LLMC, 2000, &e) == 0, "open: %.900s", e.msg);
    const int S = 1000;
    CHECK(data_num_samples(d, 1) == S, "S = %lld", (long long)data_num_samples(d, 1));
    static int32_t a[2 * 2000], b[2 * 2000], c[2 * 2000];
    data_get_samples(d, 0, 2 * S, 1, true, 42, a);
    data_get_samples(d, 0, 2 * S, 1, true, 42, b);
    data_get_samples(d, 0, 2 * S, 1, true, 43, c);
    CHECK(!memcmp(a, b, sizeof a), "same seed gave a different order");
    CHECK(memcmp(a, c, sizeof a) != 0, "another seed gave the same order");
    for (int ep = 0; ep < 2; ep++) {
        static char seen[1000];
        memset(seen, 0, sizeof seen);
        int fixed = 0;
        for (int i = 0; i < S; i++) {
            int w = a[2 * (ep * S + i)];
            CHECK(w >= 0 && w < S && !seen[w], "epoch %d: window %d repeated or out of range", ep,
                  w);
            CHECK(a[2 * (ep * S + i) + 1] == w + 1, "window %d is not [w, w+2)", w);
            seen[w] = 1;
            fixed += w == i;
        }
        /* a random permutation of 1000 has ~1 fixed point; 20 would mean no shuffle at all */
        CHECK(fixed < 20, "epoch %d has %d fixed points", ep, fixed);
    }
    int same = 0;
    for (int i = 0; i < S; i++) same += a[2 * i] == a[2 * (S + i)];
    CHECK(same < 20, "epoch 2 repeats epoch 1's order at %d of %d positions", same, S);
    /* S = 1, 2, 4, 8, 16: small domains must still be bijections (cycle-walking) */
    for (int T = 1000; T >= 59; T = T / 2 - 1) {
        int64_t s = data_num_samples(d, T);
        int32_t *o = malloc(sizeof(int32_t) * (size_t)s * (T + 1));
        data_get_samples(d, 0, (int)s, T, true, 7, o);
        static char seen[1000];
        memset(seen, 0, sizeof seen);
        for (int64_t i = 0; i < s; i++) {
            int w = o[i * (T + 1)] / T;
            if (w >= s || seen[w]) {
                free(o);
                CHECK(0, "T=%d S=%lld: window %d repeated or out of range", T, (long long)s, w);
            }
            seen[w] = 1;
        }
        free(o);
    }
    data_close(d);
}

static void test_truncated_shard_is_rejected_with_sizes(void) {
    char dir[512], p[600], pat[600];
    mkdir_in(dir, sizeof dir, "trunc");
    int32_t t[100];
    for (int k = 0; k < 100; k++) t[k] = k;
    ust_err e;
    snprintf(p, sizeof p, "%s/x.bin", dir);
    CHECK(data_write_llmc_shard(p, t, 100, &e) == 0, "%.900s", e.msg);
    CHECK(truncate(p, 1024 + 150) == 0, "truncate");
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    ust_dataset *d;
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == -1, "truncated shard accepted");
    CHECK(strstr(e.msg, "x.bin: truncated shard: header says 100 tokens (1224 bytes) but file has "
                        "1174 bytes"),
          "message: %.900s", e.msg);
}

static void test_foreign_magic_is_rejected(void) {
    char dir[512], pat[600];
    mkdir_in(dir, sizeof dir, "foreign");
    int32_t hdr[256] = {12345, 1, 0};
    write_raw("foreign/f.bin", hdr, sizeof hdr);
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    ust_dataset *d;
    ust_err e;
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == -1, "foreign file accepted");
    CHECK(strstr(e.msg, "f.bin: not an llm.c shard (magic 12345; expected 20240520 or 20240801)"),
          "message: %.900s", e.msg);
    write_raw("foreign/f.bin", "hello", 5);
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == -1 && strstr(e.msg, "not an llm.c shard"),
          "5-byte file: %.900s", e.msg);
}

static void test_token_outside_vocab_names_file_index_and_value(void) {
    char dir[512], p[600], pat[600];
    mkdir_in(dir, sizeof dir, "vocab");
    int32_t t[50] = {0};
    t[37] = 600;
    ust_err e;
    snprintf(p, sizeof p, "%s/v.bin", dir);
    CHECK(data_write_llmc_shard(p, t, 50, &e) == 0, "%.900s", e.msg);
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    ust_dataset *d;
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == -1, "token 600 accepted with vocab 512");
    CHECK(strstr(e.msg, "v.bin") && strstr(e.msg, "token 37") && strstr(e.msg, "600") &&
              strstr(e.msg, "512"),
          "message: %.900s", e.msg);
    CHECK(data_open(&d, pat, DATA_LLMC, 601, &e) == 0, "vocab 601: %.900s", e.msg);
    data_close(d);
}

static void test_empty_glob_names_the_pattern(void) {
    char pat[600];
    snprintf(pat, sizeof pat, "%s/nothing_here_*.bin", g_tmp);
    ust_dataset *d;
    ust_err e;
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == -1, "empty glob accepted");
    CHECK(strstr(e.msg, "no files match") && strstr(e.msg, pat), "message: %.900s", e.msg);
}

/* Writes PREFIX.bin and PREFIX.idx as Megatron-LM's MMapIndexedDataset lays them out: the
 * sequences' tokens back to back, and the index (magic, version 1, dtype code, counts, int32
 * sizes, int64 byte pointers, int64 document index). */
static void write_megatron(const char *prefix, const void *tokens, int width, const int32_t *sizes,
                           int count) {
    char name[128];
    int64_t total = 0, ptrs[16];
    for (int i = 0; i < count; i++) ptrs[i] = total * width, total += sizes[i];
    snprintf(name, sizeof name, "%s.bin", prefix);
    write_raw(name, tokens, (size_t)total * width);
    unsigned char buf[1024];
    size_t n = 0;
    uint64_t version = 1, cnt = (uint64_t)count, docs = (uint64_t)count + 1;
    memcpy(buf, "MMIDIDX\0\0", 9), n = 9;
    memcpy(buf + n, &version, 8), n += 8;
    buf[n++] = width == 2 ? 8 : 4; /* dtype codes: 8 = uint16, 4 = int32 */
    memcpy(buf + n, &cnt, 8), n += 8;
    memcpy(buf + n, &docs, 8), n += 8;
    memcpy(buf + n, sizes, 4 * count), n += 4 * count;
    memcpy(buf + n, ptrs, 8 * count), n += 8 * count;
    for (uint64_t d = 0; d < docs; d++) memcpy(buf + n, &d, 8), n += 8;
    snprintf(name, sizeof name, "%s.idx", prefix);
    write_raw(name, buf, n);
}

static void test_megatron_indexed_dataset_reads_the_sequences_in_order(void) {
    char dir[512], pat[600];
    mkdir_in(dir, sizeof dir, "meg");
    uint16_t a[9];
    int32_t b[7], sa[3] = {4, 2, 3}, sb[2] = {5, 2};
    for (int k = 0; k < 9; k++) a[k] = (uint16_t)(100 + k);
    for (int k = 0; k < 7; k++) b[k] = 109 + k; /* int32 tokens continue the stream */
    write_megatron("meg/a_text_document", a, 2, sa, 3);
    write_megatron("meg/b_text_document", b, 4, sb, 2);
    snprintf(pat, sizeof pat, "%s/*_text_document.bin", dir);
    ust_dataset *d;
    ust_err e;
    CHECK(data_open(&d, pat, DATA_MEGATRON, 512, &e) == 0, "open: %.900s", e.msg);
    CHECK(data_num_tokens(d) == 16, "%lld tokens", (long long)data_num_tokens(d));
    int32_t out[8];
    data_get_samples(d, 1, 1, 7, false, 0, out); /* tokens [7, 15): across the two files */
    data_close(d);
    for (int j = 0; j < 8; j++) CHECK(out[j] == 107 + j, "token %d = %d", j, out[j]);
}

static void test_megatron_bad_index_is_rejected_with_a_reason(void) {
    char dir[512], pat[600], idx[600];
    mkdir_in(dir, sizeof dir, "megbad");
    uint16_t a[6] = {1, 2, 3, 4, 5, 6};
    int32_t sa[2] = {4, 2};
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    ust_dataset *d;
    ust_err e;
    write_megatron("megbad/x", a, 2, sa, 2);
    CHECK(data_open(&d, pat, DATA_MEGATRON, 5, &e) == -1 && strstr(e.msg, "outside"),
          "token 5 with vocab 5: %.900s", e.msg);
    write_raw("megbad/x.bin", a, 10); /* the index describes 12 bytes */
    CHECK(data_open(&d, pat, DATA_MEGATRON, 512, &e) == -1 && strstr(e.msg, "12 bytes"),
          "short .bin: %.900s", e.msg);
    int32_t neg[2] = {4, -2}; /* contiguous pointers, so only the size is wrong */
    write_megatron("megbad/x", a, 2, neg, 2);
    CHECK(data_open(&d, pat, DATA_MEGATRON, 512, &e) == -1 &&
              strstr(e.msg, "sequence 1 has a negative size (-2 tokens)"),
          "negative size: %.900s", e.msg);
    write_raw("megbad/x.idx", "MMIDIDX", 7);
    CHECK(data_open(&d, pat, DATA_MEGATRON, 512, &e) == -1 && strstr(e.msg, "magic"),
          "bad magic: %.900s", e.msg);
    path_in(idx, sizeof idx, "megbad/x.idx");
    remove(idx);
    CHECK(data_open(&d, pat, DATA_MEGATRON, 512, &e) == -1 && strstr(e.msg, "x.idx"),
          "missing index: %.900s", e.msg);
}

static void test_nanogpt_raw_uint16(void) {
    char dir[512], pat[600];
    mkdir_in(dir, sizeof dir, "nano");
    uint16_t t[21];
    for (int k = 0; k < 21; k++) t[k] = (uint16_t)(1000 + k);
    write_raw("nano/n_0.bin", t, 20);      /* 10 tokens */
    write_raw("nano/n_1.bin", t + 10, 22); /* 11 tokens */
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    ust_dataset *d;
    ust_err e;
    CHECK(data_open(&d, pat, DATA_NANOGPT, 50257, &e) == 0, "open: %.900s", e.msg);
    CHECK(data_num_tokens(d) == 21, "%lld tokens", (long long)data_num_tokens(d));
    int32_t out[6];
    data_get_samples(d, 1, 1, 5, false, 0, out); /* tokens [5, 11) crosses the boundary */
    for (int j = 0; j < 6; j++) CHECK(out[j] == 1005 + j, "token %d = %d", j, out[j]);
    data_close(d);
    write_raw("nano/n_1.bin", t, 7);
    CHECK(data_open(&d, pat, DATA_NANOGPT, 50257, &e) == -1 && strstr(e.msg, "odd size"),
          "odd-size nanogpt file: %.900s", e.msg);
}

static int read_file(const char *path, unsigned char **buf, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)*n);
    long got = (long)fread(*buf, 1, (size_t)*n, f);
    fclose(f);
    return got == *n ? 0 : -1;
}

static void test_demo_data_reopens_with_vocab_512_and_is_deterministic(void) {
    char a[512], b[512], pat[600];
    path_in(a, sizeof a, "demo_a/x"); /* mkdir -p of a nested dir */
    path_in(b, sizeof b, "demo_b");
    ust_err e;
    CHECK(data_write_demo(a, &e) == 0, "demo: %.900s", e.msg);
    CHECK(data_write_demo(b, &e) == 0, "demo: %.900s", e.msg);
    const char *files[] = {"train_000.bin", "train_001.bin", "val_000.bin"};
    for (int i = 0; i < 3; i++) {
        char pa[700], pb[700];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        unsigned char *ba, *bb;
        long na, nb;
        CHECK(read_file(pa, &ba, &na) == 0 && read_file(pb, &bb, &nb) == 0, "reading %s", files[i]);
        int same = na == nb && !memcmp(ba, bb, (size_t)na);
        free(ba);
        free(bb);
        CHECK(same, "%s differs between two runs", files[i]);
    }
    ust_dataset *d;
    snprintf(pat, sizeof pat, "%s/train_*.bin", a);
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == 0, "open train: %.900s", e.msg);
    int64_t n = data_num_tokens(d);
    CHECK(data_num_shards(d) == 2 && n > 1100000 && n < 1400000, "%d shards, %lld tokens",
          data_num_shards(d), (long long)n);
    /* it is text: mostly lowercase letters and spaces, with end-of-text separators */
    int32_t w[257];
    data_get_samples(d, 100, 1, 256, false, 0, w);
    int letters = 0;
    for (int j = 0; j < 257; j++) letters += (w[j] >= 'a' && w[j] <= 'z') || w[j] == ' ';
    CHECK(letters > 200, "only %d of 257 tokens are letters/spaces", letters);
    data_close(d);
    snprintf(pat, sizeof pat, "%s/val_*.bin", a);
    CHECK(data_open(&d, pat, DATA_LLMC, 512, &e) == 0, "open val: %.900s", e.msg);
    n = data_num_tokens(d);
    CHECK(n >= 100000 && n < 120000, "val has %lld tokens", (long long)n);
    data_close(d);
}

static void test_prep_bytes_splits_train_and_val_with_end_of_text(void) {
    char in1[512], in2[512], out[512], pat[600];
    path_in(in1, sizeof in1, "doc1.txt");
    path_in(in2, sizeof in2, "doc2.txt");
    path_in(out, sizeof out, "prep");
    /* 60 + 38 bytes plus two end-of-text tokens = 100 tokens; val = last 10 */
    char t1[61], t2[39];
    memset(t1, 'a', 60);
    t1[60] = 0;
    memset(t2, 'b', 38);
    t2[38] = 0;
    write_raw("doc1.txt", t1, 60);
    write_raw("doc2.txt", t2, 38);
    const char *inputs[] = {in1, in2};
    prep_args args = {
        .inputs = inputs, .ninputs = 2, .out_dir = out, .val_fraction = 0.1, .shard_tokens = 40};
    ust_err e;
    CHECK(prep_bytes(&args, &e) == 0, "prep: %.900s", e.msg);
    ust_dataset *d;
    snprintf(pat, sizeof pat, "%s/train_*.bin", out);
    CHECK(data_open(&d, pat, DATA_LLMC, 257, &e) == 0, "open train: %.900s", e.msg);
    CHECK(data_num_shards(d) == 3 && data_num_tokens(d) == 90, "%d shards, %lld tokens",
          data_num_shards(d), (long long)data_num_tokens(d));
    int32_t w[90];
    data_get_samples(d, 0, 1, 89, false, 0, w);
    for (int j = 0; j < 90; j++) {
        int want = j < 60 ? 'a' : j == 60 ? 256 : 'b';
        CHECK(w[j] == want, "train token %d = %d, expected %d", j, w[j], want);
    }
    data_close(d);
    snprintf(pat, sizeof pat, "%s/val_*.bin", out);
    CHECK(data_open(&d, pat, DATA_LLMC, 257, &e) == 0, "open val: %.900s", e.msg);
    CHECK(data_num_tokens(d) == 10, "val has %lld tokens", (long long)data_num_tokens(d));
    int32_t v[10];
    data_get_samples(d, 0, 1, 9, false, 0, v);
    CHECK(v[0] == 'b' && v[8] == 'b' && v[9] == 256, "val tokens %d..%d,%d", v[0], v[8], v[9]);
    data_close(d);
    /* with enough data (>= 4 shards) val gets at least a whole shard; negative: no val */
    char out2[512], out3[512];
    path_in(out2, sizeof out2, "prep2");
    path_in(out3, sizeof out3, "prep3");
    prep_args a2 = {
        .inputs = inputs, .ninputs = 2, .out_dir = out2, .val_fraction = 0.05, .shard_tokens = 20};
    CHECK(prep_bytes(&a2, &e) == 0, "prep2: %.900s", e.msg);
    snprintf(pat, sizeof pat, "%s/val_*.bin", out2);
    CHECK(data_open(&d, pat, DATA_LLMC, 257, &e) == 0, "open val: %.900s", e.msg);
    int64_t nv = data_num_tokens(d);
    data_close(d);
    CHECK(nv == 20, "val has %lld tokens, expected one shard of 20", (long long)nv);
    prep_args a3 = {.inputs = inputs, .ninputs = 2, .out_dir = out3, .val_fraction = -1};
    CHECK(prep_bytes(&a3, &e) == 0, "prep3: %.900s", e.msg);
    snprintf(pat, sizeof pat, "%s/val_*.bin", out3);
    CHECK(data_open(&d, pat, DATA_LLMC, 257, &e) == -1, "val shards written with val_fraction < 0");
    const char *missing[] = {"/nonexistent/file.txt"};
    prep_args bad = {.inputs = missing, .ninputs = 1, .out_dir = out};
    CHECK(prep_bytes(&bad, &e) == UST_EXIT_USAGE && strstr(e.msg, "/nonexistent/file.txt"),
          "missing input: %.900s", e.msg);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ust_test_data.XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    RUN_TEST(test_llmc_shard_width_follows_max_token);
    RUN_TEST(test_windows_without_shuffle_cross_shard_boundaries);
    RUN_TEST(test_shuffle_is_a_permutation_per_epoch_and_seeded);
    RUN_TEST(test_target_mask_follows_the_windows_across_shards);
    RUN_TEST(test_truncated_shard_is_rejected_with_sizes);
    RUN_TEST(test_foreign_magic_is_rejected);
    RUN_TEST(test_token_outside_vocab_names_file_index_and_value);
    RUN_TEST(test_empty_glob_names_the_pattern);
    RUN_TEST(test_megatron_indexed_dataset_reads_the_sequences_in_order);
    RUN_TEST(test_megatron_bad_index_is_rejected_with_a_reason);
    RUN_TEST(test_nanogpt_raw_uint16);
    RUN_TEST(test_demo_data_reopens_with_vocab_512_and_is_deterministic);
    RUN_TEST(test_prep_bytes_splits_train_and_val_with_end_of_text);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return TEST_SUMMARY();
}
