/* data: tokenized shards -> the run's deterministic sample order.
 * Shards matching a glob are mmap'd and concatenated in sorted order into one token stream.
 * Formats: llm.c (256 x int32 header; magic 20240520 = uint16 tokens, 20240801 = uint32;
 * header[2] = token count), nanoGPT raw uint16, Megatron .bin/.idx (the glob names the .bin files).
 * Sample i is the window tokens[i*T, i*T + T + 1) of the stream; with shuffle, sample i of
 * epoch e is window perm_e(i) (a seeded permutation). The loader state is one number, the global
 * sample index, so resume and re-layout neither skip nor repeat data.
 * Opening validates headers, sizes and that every token id is < vocab_size (vocab_size <= 0
 * skips the id check). Shards must not change during the run: reading a window re-checks its
 * shard (inode, size, mtime) and every id it copies, and a change ends the run (exit 1, the shard
 * named); a shard truncated under the mapping ends it the same way (fs_guard_mapping). */
#ifndef UST_DATA_H
#define UST_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "error.h"

typedef struct ust_dataset ust_dataset;

int data_open(ust_dataset **out, const char *glob_pattern, ust_data_format fmt, int vocab_size,
              ust_err *e);
void data_close(ust_dataset *d);
int64_t data_num_tokens(const ust_dataset *d);
int data_num_shards(const ust_dataset *d);
int64_t data_num_samples(const ust_dataset *d, int T); /* windows per epoch: (ntok-1)/T */
/* Checks that the stream holds at least one window of T+1 tokens (call once at start; getting
 * samples from a dataset that fails this is fatal). */
int data_check_seq_len(const ust_dataset *d, int T, ust_err *e);

/* Writes n samples starting at global sample index `first` into out (n x (T+1) int32).
 * Indices past one epoch wrap into the next epoch (reshuffled with the epoch number). */
void data_get_samples(const ust_dataset *d, int64_t first, int n, int T, bool shuffle,
                      uint64_t seed, int32_t *out);

/* Writes the bundled demo dataset (generated text, byte-level tokens, llm.c uint16 shards:
 * DIR/train_000.bin, DIR/train_001.bin, DIR/val_000.bin). Deterministic. */
int data_write_demo(const char *dir, ust_err *e);

/* Fills an llm.c header for ntok tokens of width 2 (uint16) or 4 (uint32) bytes. */
int data_llmc_header(int32_t hdr[256], int width, int64_t ntok, const char *path, ust_err *e);

/* Writes one llm.c shard (uint16 when max token < 65536, else uint32). */
int data_write_llmc_shard(const char *path, const int32_t *tokens, int64_t n, ust_err *e);

#endif
