/* data: tokenized shards -> the run's deterministic sample order.
 * Shards matching a glob are mmap'd and concatenated in sorted order into one token stream.
 * Formats: llm.c (256 x int32 header; magic 20240520 = uint16 tokens, 20240801 = uint32;
 * header[2] = token count; version 2 adds a target mask), nanoGPT raw uint16, Megatron .bin/.idx
 * (the glob names the .bin files). Sample i is the window tokens[i*T, i*T + T + 1) of the stream;
 * with shuffle, sample i of epoch e is window perm_e(i) (a seeded permutation). The loader state is
 * one number, the global sample index, so resume and re-layout neither skip nor repeat data. Token
 * ids are checked against vocab_size at open, and shards must not change during the run (data_open
 * and data_get_samples say how). */
#ifndef UST_DATA_H
#define UST_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "error.h"

typedef struct ust_dataset ust_dataset;

/* Opening validates headers, sizes and that every token id is < vocab_size (vocab_size <= 0
 * skips the id check). */
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
 * Indices past one epoch wrap into the next epoch (reshuffled with the epoch number).
 * Shards must not change during the run: reading a window re-checks its shard (inode, size,
 * mtime) and every id it copies, and a change ends the run (exit 1, the shard named); a shard
 * truncated under the mapping ends it the same way (fs_guard_mapping). */
void data_get_samples(const ust_dataset *d, int64_t first, int n, int T, bool shuffle,
                      uint64_t seed, int32_t *out);
/* Shards may carry a target mask (llm.c version 2, data_write_llmc_shard_mask): which tokens are
 * targets of the loss. data_get_masks gives the flags (1: target) of the windows data_get_samples
 * gives; a shard without a mask has every token a target. */
bool data_has_mask(const ust_dataset *d);
/* Tokens and target flags [pos, pos + n) of the stream (flags 1 where a shard has no mask). */
void data_read_tokens(const ust_dataset *d, int64_t pos, int64_t n, int32_t *out);
void data_read_flags(const ust_dataset *d, int64_t pos, int64_t n, uint8_t *out);

/* data.packing: first_fit: from here on the samples are whole examples packed into windows of
 * T+1 tokens (core/io/data_pack.h says how); data_num_samples counts those windows, and the
 * flags (always given) are 1 for a target, 0 for another token, 2 for padding (end of text). */
typedef struct {
    int64_t examples, windows, split, dropped; /* overlong examples split or dropped */
    int64_t tokens, pad;                       /* tokens packed, padding tokens */
} data_pack_stats;
int data_pack(ust_dataset *d, int T, int eot, int buffer, bool drop, data_pack_stats *st,
              ust_err *e);
void data_get_masks(const ust_dataset *d, int64_t first, int n, int T, bool shuffle, uint64_t seed,
                    uint8_t *out);

/* ---- weighted blends (Megatron's BlendedDataset semantics) ----
 * Global sample i of the run comes from dataset argmax_d (w_d (j + 1) - n_d), the first on ties,
 * where w are the weights normalized to sum 1, j = i - base_sample the samples since the current
 * weights began and n_d the samples dataset d gave since then: after N samples every dataset has
 * given w_d N within one sample. Dataset d's k-th sample is its window k (data_get_samples: a new
 * epoch, reshuffled with the dataset's own seed, when it runs out). The position is one count per
 * dataset, so resume and re-layout continue exactly; every rank assigns the whole global batch
 * itself and reads its share. A lone glob is a blend of one: sample i is its window i. */
typedef struct data_blend data_blend;
typedef struct {
    int64_t consumed[CFG_MAX_BLEND]; /* samples each dataset has given */
    int64_t base_sample;             /* the run's sample index where the current weights began */
    int64_t base_consumed[CFG_MAX_BLEND]; /* consumed at that point */
} data_blend_pos;

/* Opens every dataset (format -1: fmt), each checked to hold a window of T+1 tokens; a dataset
 * that fails is named with its index and glob. */
int data_blend_open(data_blend **out, const cfg_dataset *sets, int n, ust_data_format fmt,
                    int vocab_size, int T, ust_err *e);
void data_blend_close(data_blend *b);
int data_blend_count(const data_blend *b);
const cfg_dataset *data_blend_set(const data_blend *b, int d);
int64_t data_blend_epoch_samples(const data_blend *b, int d, int T); /* windows per epoch */
/* Global samples [i, i + n) -> which[k] (dataset) and index[k] (its sample), advancing pos (i is
 * where pos stands: base_sample plus the samples given since). */
void data_blend_assign(const data_blend *b, data_blend_pos *pos, int64_t i, int64_t n, int *which,
                       int64_t *index);
/* Sample `index` of dataset d: T+1 tokens into out. Dataset 0 shuffles with seed itself (so a
 * lone glob reads what data_get_samples reads), dataset d with a seed of its own. */
void data_blend_get(const data_blend *b, int d, int64_t index, int T, bool shuffle, uint64_t seed,
                    int32_t *out);
/* Some dataset carries a target mask; the flags of the window data_blend_get gives. */
bool data_blend_has_mask(const data_blend *b);
/* data_pack for every dataset (windows of T+1); *st sums their figures. */
int data_blend_pack(data_blend *b, int T, int eot, int buffer, bool drop, data_pack_stats *st,
                    ust_err *e);
void data_blend_get_mask(const data_blend *b, int d, int64_t index, int T, bool shuffle,
                         uint64_t seed, uint8_t *out);

/* The position in a checkpoint's state (state.json): "data": {"datasets": [{path, weight,
 * consumed, base_consumed}], "base_sample"}. Restoring at sample index i accepts the same blend
 * (and a state from before blends when the run has one dataset); another blend is refused unless
 * allow_reweight, which keeps each kept dataset's count and starts the new weights at i (note
 * says so; "" otherwise). */
struct cJSON;
void data_blend_save(const data_blend *b, const data_blend_pos *pos, struct cJSON *state);
int data_blend_restore(const data_blend *b, const struct cJSON *state, int64_t i,
                       bool allow_reweight, data_blend_pos *pos, char *note, size_t cap,
                       ust_err *e);

/* meta.json beside a dataset's shards (the directory of its glob), as `ustrain data prep` writes
 * it: the vocabulary size and end-of-text id its tokens were made with (-1 where not given), the
 * tokenizer and its SHA-256 ("" where not given). Read as a regular file of at most 1 MiB (a
 * FIFO there is refused, never waited on). Returns 1 when found, 0 when there is none, -1
 * (message naming the file) when it cannot be read or is malformed. The one reader of meta.json:
 * data checks, eval.tokenizer's default, the tokenizer a checkpoint records. */
typedef struct {
    int vocab_size, eot_id;
    char path[UST_PATH_MAX + 16];
    char tokenizer[UST_PATH_MAX], tokenizer_sha256[72];
} data_meta;
int data_meta_read(const char *glob_pattern, data_meta *out, ust_err *e);
/* Every dataset's meta.json (train and val) against the config, without reading a token: the
 * shards' vocabulary must fit model.vocab_size; *eot gets the end-of-text id (data.eot_id, else
 * the shards'; they must agree), which data.doc_mask and reset_positions need. */
int data_check_meta(const ust_config *c, int *eot, ust_err *e);

/* Writes the bundled demo dataset (generated text, byte-level tokens, llm.c uint16 shards:
 * DIR/train_000.bin, DIR/train_001.bin, DIR/val_000.bin). Deterministic. */
int data_write_demo(const char *dir, ust_err *e);

/* Fills an llm.c header for ntok tokens of width 2 (uint16) or 4 (uint32) bytes. */
int data_llmc_header(int32_t hdr[256], int width, int64_t ntok, const char *path, ust_err *e);

/* Writes one llm.c shard (uint16 when max token < 65536, else uint32). */
int data_write_llmc_shard(const char *path, const int32_t *tokens, int64_t n, ust_err *e);
/* The same with a target flag per token (mask[i] != 0: token i is a target): version 2, the
 * tokens followed by ceil(n / 8) bytes, bit i % 8 of byte i / 8 for token i. NULL: version 1. */
int data_write_llmc_shard_mask(const char *path, const int32_t *tokens, const uint8_t *mask,
                               int64_t n, ust_err *e);
/* A version-2 header (as data_llmc_header), and n flags packed into those bits. */
int data_llmc_header_mask(int32_t hdr[256], int width, int64_t ntok, const char *path, ust_err *e);
void data_pack_mask(const uint8_t *flags, int64_t n, uint8_t *bits);

#endif
