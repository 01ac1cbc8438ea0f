#!/usr/bin/env bash
# The model families beyond Llama/Qwen2/Mixtral/GPT-2 (docs/huggingface.md), one block each:
# Qwen3 (model.qk_norm: RMSNorm over each head's q and k before RoPE), YaRN-scaled Llama
# (model.rope_scaling.type: yarn); the sliding-window
# families are test/sh/hf_windows.sh's (helpers: test/hf_lib.sh). For each: a numpy-made
# directory imports and exports bit-identically; the import trains the one-process losses under
# tp (with and without sp), cp, pp (1f1b and zero-bubble), dp ZeRO-3 and full recompute; and
# against transformers' own tiny model (its class, random weights): the loss on the same windows
# within 1e-5 relative, greedy generate token-identical for 32 tokens, and after 10 steps of
# training under dp=2 x tp=2 and pp=2 the export loads in transformers with every key used and
# gives ustrain's validation loss. Bad configs exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"
need_py hf_families_python_deps numpy || exit 0
. "$(dirname "$0")/../hf_lib.sh"

# ------------------------------------------------------------------ Qwen3: per-head q/k norms
roundtrip qwen3_bf16_sharded qwen3 --dtype bf16 --shards 2
python3 - $TMP <<'EOF'
import json, sys
a = json.load(open(f"{sys.argv[1]}/qwen3_bf16_sharded-out/config.json"))
ok = a["architectures"] == ["Qwen3ForCausalLM"] and a["model_type"] == "qwen3" and a["head_dim"] == 16
print("PASS qwen3_exports_as_qwen3" if ok else f"FAIL qwen3_exports_as_qwen3: {a['architectures']}")
EOF
expect_exit qwen3_validate_says_qk_norm 0 "model: llama, 2 layers" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/qwen3_bf16_sharded
$EQ --name _hf_qwen3 --set model.init_from=$TMP/qwen3_bf16_sharded --layout "tp=2" \
    --layout "tp=2 sp=true dp=2 zero=1" --layout "cp=2" --layout "pp=2" --layout "pp=2 sched=zb" \
    --layout "dp=2 zero=3" --layout "tp=2 train.recompute=full"
# the norm weights are whole on every tp rank: their gradients summed over the group
if need_py hf_families_transformers torch transformers; then
    versus_transformers qwen3
fi
# bad input
$MAKE make qwen3 $TMP/b-q3bias --set 'attention_bias=true'
expect_exit qwen3_attention_bias_exits_2 2 "'attention_bias': true is not supported \(Qwen3ForCausalLM" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-q3bias --set checkpoint.dir=$TMP/b
$MAKE make qwen3 $TMP/b-q3win --set 'use_sliding_window=true' --set 'max_window_layers=0'
expect_exit qwen3_sliding_window_without_size_exits_2 2 "b-q3win/config.json: 'sliding_window' is missing" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-q3win --set checkpoint.dir=$TMP/b
expect_exit qk_norm_on_gpt2_exits_2 2 "model.qk_norm: true applies to llama" -- \
    $UST validate $TMP/eq.yaml --set model.arch=gpt2 --set model.qk_norm=true

# ------------------------------------------------------------------ YaRN rope scaling
# factor 4 over 16 original positions in sequences of 32: positions past the original maximum
roundtrip llama_yarn_f32 llama_yarn
python3 - $TMP <<'EOF2'
import json, sys
a = json.load(open(f"{sys.argv[1]}/llama_yarn_f32-out/config.json"))["rope_scaling"]
ok = a["rope_type"] == "yarn" and a["factor"] == 4 and a["original_max_position_embeddings"] == 16
print("PASS llama_yarn_config_round_trips" if ok else f"FAIL llama_yarn_config_round_trips: {a}")
EOF2
expect_exit yarn_validate_prints_it 0 "rope: theta 10000, yarn scaling factor 4 \(original 16, beta_fast 32, beta_slow 1, attention factor 1.13863" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/llama_yarn_f32
$EQ --name _hf_llama_yarn --set model.init_from=$TMP/llama_yarn_f32 --layout "tp=2" --layout "cp=2"
if need_py hf_families_yarn_transformers torch transformers; then
    versus_transformers llama_yarn
fi
$MAKE make llama $TMP/b-yarn-prf --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5}'
expect_exit yarn_partial_rotary_exits_2 2 "b-yarn-prf/config.json: 'partial_rotary_factor' is not supported" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-yarn-prf --set checkpoint.dir=$TMP/b
exit 0
