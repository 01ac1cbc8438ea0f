#!/usr/bin/env bash
# DeepSeek-V3's multi-head latent attention against transformers (docs/deepseek.md): a tiny
# random DeepseekV3ForCausalLM built by transformers' own class, every layer dense
# (first_k_dense_replace = layers: DeepSeek's MoE routing is not imported yet), rope_interleave
# true, with the q latent (q_lora_rank 24; YaRN factor 4 over 16 positions with DeepSeek's
# mscale 1 / mscale_all_dim 1: the softmax scale x 1.296) and without (null, no scaling). For each: the import's loss
# within 1e-5 relative of transformers', greedy generate token-identical for 32 tokens (the
# latent cache), and the export bit-identical to the import and loaded by transformers with
# every key used and the same loss; with the q latent also 10 trained steps under dp=2 x tp=2
# and pp=2 exported and checked (hf_lib.sh's versus_transformers). A MoE DeepSeek and attention
# biases exit 2.
. "$(dirname "$0")/../lib.sh"
need_py hf_deepseek_transformers numpy torch transformers || exit 0
. "$(dirname "$0")/../hf_lib.sh"

versus_transformers deepseek_v3
$UST export $TMP/tf-deepseek_v3-ck/step_0 --to hf $TMP/ds-rt >/dev/null 2>&1
$MAKE compare deepseek_v3_export $TMP/tf-deepseek_v3 $TMP/ds-rt
expect_exit deepseek_v3_generate_reports_the_latent_cache 0 \
    "generate: cache 192 bytes per token \(the latent: kv_lora_rank \+ qk_rope_head_dim per layer, 2 layers\)" -- \
    $UST generate $TMP/tf-deepseek_v3 --prompt "Once" --tokenizer bytes --temperature 0 --max-new-tokens 2

# without the q latent: q = q_proj(x)
d=$TMP/tf-noq
$MAKE transformers deepseek_v3_noq $d >$d.log 2>&1 || fail deepseek_v3_noq_builds "$(tail -1 $d.log)"
vl=$($UST train $TMP/run.yaml --set model.init_from=$d --set checkpoint.dir=$d-ck 2>&1 |
    sed -n 's/^step 0: val_loss \([0-9.]*\).*/\1/p')
python3 test/tools/hf_export_check.py transformers deepseek_v3_noq_import $d $TMP/data/val_000.bin 4 32 "$vl" 1e-5 2>&1 |
    grep -E '^(PASS|FAIL|  )'
ids=$(python3 -c 'import sys; print(",".join(str(b) for b in sys.argv[1].encode()))' "Once upon a time")
$UST generate $d --prompt "Once upon a time" --tokenizer bytes --temperature 0 --max-new-tokens 32 \
    --dump-logits $d.logits >/dev/null 2>&1
python3 test/tools/generate_check.py transformers deepseek_v3_noq_greedy_generate_matches_transformers $d "$ids" $d.logits 2>&1 |
    grep -E '^(PASS|FAIL)'

# bad input: MoE layers (first_k_dense_replace < layers), attention biases
mkdir -p $TMP/b-moe $TMP/b-bias
cp $d/model.safetensors $TMP/b-moe/ && cp $d/model.safetensors $TMP/b-bias/
python3 - $d $TMP <<'EOF2'
import json, sys
c = json.load(open(f"{sys.argv[1]}/config.json"))
json.dump(dict(c, first_k_dense_replace=1), open(f"{sys.argv[2]}/b-moe/config.json", "w"))
json.dump(dict(c, attention_bias=True), open(f"{sys.argv[2]}/b-bias/config.json", "w"))
EOF2
expect_exit deepseek_v3_moe_layers_exit_2 2 "'first_k_dense_replace' = 1 < num_hidden_layers = 2: layers 1.. are DeepSeek MoE layers" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-moe --set checkpoint.dir=$TMP/b
expect_exit deepseek_v3_attention_bias_exits_2 2 "'attention_bias': true is not supported \(DeepseekV3ForCausalLM" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-bias --set checkpoint.dir=$TMP/b
exit 0
