/* hf_config: a transformers config.json (LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM,
 * GPT2LMHeadModel) as ustrain's model section, refusing what ustrain cannot compute as
 * transformers does (other architectures, RoPE types, sliding windows, biases, activations) with
 * the key and value named; and that section put into a run's config, where keys the user set
 * explicitly must agree. hf_import's half that knows config.json's keys. */
#ifndef UST_HF_CONFIG_H
#define UST_HF_CONFIG_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "config.h"
#include "error.h"

/* j (config.json at path) -> c: the defaults with the model section, validated by cfg_validate
 * as a run's would be; arch gets architectures[0] (or the model_type's). -1 with a message. */
int hf_config_parse(const cJSON *j, const char *path, ust_config *c, char *arch, size_t cap,
                    ust_err *e);
/* hf's model section (from hf_config_parse of dir/config.json) into c; a key c was given
 * explicitly (cfg_was_set) with another value -> -1 naming both, and c is left as it was. */
int hf_config_apply(const ust_config *hf, const char *dir, ust_config *c, ust_err *e);
/* -1 naming file:line:col and the key when a string of the JSON text s[0..n) holds an escaped NUL
 * (\u0000): cJSON's C strings would end there, so "silu\u0000gelu" would read as "silu". */
int hf_json_refuse_nul(const char *s, size_t n, const char *file, ust_err *e);

#endif
