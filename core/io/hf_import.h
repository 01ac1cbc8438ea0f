/* hf_import: a Hugging Face model directory (config.json + model.safetensors, or
 * model.safetensors.index.json and its shards) as the starting weights of a run.
 * hf_open reads config.json (hf_config's architectures; anything else is refused naming what is
 * unsupported), maps every shard and checks, before any weight is read, that the files hold
 * exactly the tensors hf_map's table implies for that config, with its shapes, in F32, BF16, F16
 * or F8_E4M3 with DeepSeek-V3's per-block scales (dequantized). hf_apply_config puts the model
 * section into the run's config (explicitly set keys must agree); hf_read_slice reads one rank's
 * box of a ustrain tensor, touching only the bytes of that box (the table read backwards). */
#ifndef UST_HF_IMPORT_H
#define UST_HF_IMPORT_H

#include <stdint.h>

#include "ckpt.h"
#include "config.h"
#include "error.h"

typedef struct hf_model hf_model;

/* path is a directory holding an entry named config.json, of any kind (what model.init_from,
 * eval and generate treat as a Hugging Face model; hf_open refuses one that is not a file). */
int hf_is_model_dir(const char *path);
/* config.json + the safetensors (single or index + shards), all headers validated; NULL + message.
 */
hf_model *hf_open(const char *dir, ust_err *e);
void hf_close(hf_model *h);
/* c's model section from config.json (arch, n_layer, d_model, heads, kv heads, d_ff, vocab_size,
 * max_seq_len, rope_theta, norm_eps, tie_embeddings, qkv_bias, rope_scaling, moe.*); a key the
 * user set explicitly (cfg_was_set) that disagrees -> -1 naming both values. */
int hf_apply_config(const hf_model *h, ust_config *c, ust_err *e);
/* When c's model.init_from is a Hugging Face model directory: hf_open + hf_apply_config +
 * hf_close, so that every command resolves model.arch: auto and the shape the same way. */
int hf_resolve_config(ust_config *c, ust_err *e);
/* ustrain tensor t (canonical name, whole shape) restricted to slice s, as fp32 (BF16/F16
 * widened): vocabulary rows beyond vocab_size zero, Conv1D transposed back, GPT-2's c_attn split
 * into q/k/v. Reads only the slice's bytes of the mapped files. */
int hf_read_slice(hf_model *h, const ckpt_tensor *t, const ckpt_slice *s, float *out, ust_err *e);
/* hf_read_slice refuses a slice holding NaN or Inf, naming the tensor, unless allowed
 * (model.allow_nonfinite, generate's --allow-nonfinite). */
void hf_allow_nonfinite(hf_model *h, int allow);
int64_t hf_bytes_read(const hf_model *h);   /* bytes of tensor data this process read so far */
int64_t hf_tensor_bytes(const hf_model *h); /* bytes of the model's tensors in the files */

#endif
