#!/usr/bin/env bash
# model.init_from: a Hugging Face model directory. test/tools/hf_make_model.py writes tiny
# directories with numpy (Llama untied/tied, Llama 3.1 rope_scaling, Qwen2 biases, Mixtral, GPT-2;
# F32, BF16, F16; one file or an index with 2-3 shards); ustrain imports each (train.steps: 0
# writes checkpoint step 0) and exports it again, and every tensor must come back bit-identical.
# Imports under tp, pp, cp, ep and dp ZeRO-3 train the one-process losses (equivalence harness),
# each rank reads about its share of the bytes, bad directories exit 2 naming the file, tensor
# or value and write nothing, and where torch and transformers are importable, models that
# transformers itself built give transformers' loss within 1e-5 relative.
. "$(dirname "$0")/../lib.sh"

need_py hf_import_python_deps numpy || exit 0
. "$(dirname "$0")/../hf_lib.sh"

roundtrip llama_f32 llama
roundtrip llama_bf16_sharded llama --dtype bf16 --shards 3
roundtrip llama_tied_f16 llama_tied --dtype f16 --shards 2
roundtrip llama3_rope_bf16 llama3 --dtype bf16
roundtrip qwen2_f32_sharded qwen2 --shards 2
roundtrip mixtral_bf16_sharded mixtral --dtype bf16 --shards 3
roundtrip gpt2_f32 gpt2
roundtrip gpt2_bf16_sharded gpt2 --dtype bf16 --shards 2
# as the Hub's GPT-2 files are: no "transformer." prefix, the attention mask buffers beside
roundtrip gpt2_hub_names gpt2 --hub-names 1

# config.json travels: the export of an import says what the original said
python3 - $TMP <<'EOF'
import json, sys
t = sys.argv[1]
for tag, keys in [("qwen2_f32_sharded", ["architectures", "model_type", "num_key_value_heads"]),
                  ("llama3_rope_bf16", ["rope_scaling", "rope_theta", "tie_word_embeddings"]),
                  ("llama_tied_f16", ["tie_word_embeddings", "vocab_size"]),
                  ("mixtral_bf16_sharded", ["num_local_experts", "num_experts_per_tok",
                                            "router_aux_loss_coef"])]:
    a = json.load(open(f"{t}/{tag}/config.json"))
    b = json.load(open(f"{t}/{tag}-out/config.json"))
    bad = [k for k in keys if a.get(k) != b.get(k)]
    print(f"PASS {tag}_config_round_trips" if not bad else
          f"FAIL {tag}_config_round_trips: {[(k, a.get(k), b.get(k)) for k in bad]}")
EOF

# a coefficient the config sets itself wins over config.json's router_aux_loss_coef (0.001)
$UST train $TMP/run.yaml --set model.init_from=$TMP/mixtral_bf16_sharded --set model.moe.aux_loss_coef=0.05 \
    --set checkpoint.dir=$TMP/aux-ck >$TMP/aux.log 2>&1 &&
    $UST export $TMP/aux-ck/step_0 --to hf $TMP/aux-out >/dev/null 2>&1 &&
    grep -qE '"router_aux_loss_coef":[[:space:]]*0.05[,}]?$' $TMP/aux-out/config.json && pass hf_config_aux_coef_set_by_the_config_wins ||
    fail hf_config_aux_coef_set_by_the_config_wins "$(grep -o '"router_aux_loss_coef":[^,]*' $TMP/aux-out/config.json) $(tail -1 $TMP/aux.log)"

# --- validate and plan resolve model.arch: auto the same way
expect_exit hf_validate_resolves_arch_auto 0 "model: llama, 2 layers, d_model 64, 4 heads \(2 kv\).*vocab 300" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/mixtral_bf16_sharded
expect_exit hf_plan_resolves_arch_auto 0 "model: gpt2, .* 2 layers, d_model 64" -- \
    $UST plan $TMP/run.yaml --world 2 --set model.init_from=$TMP/gpt2_f32
expect_exit hf_validate_auto_without_init_from_exits_2 2 "model.arch: auto takes the architecture from a Hugging Face model directory" -- \
    $UST validate $TMP/run.yaml

# --- every layout trains the one-process losses from the same import
$EQ --name _hf_llama --set model.init_from=$TMP/llama_bf16_sharded --layout "tp=2" --layout "pp=2" \
    --layout "cp=2" --layout "dp=2 zero=3" --layout "tp=2 sp=true dp=2 zero=1"
$EQ --name _hf_mixtral --set model.init_from=$TMP/mixtral_bf16_sharded --layout "dp=2 ep=2" \
    --layout "dp=2 ep=2 zero=3"
$EQ --name _hf_gpt2_tied --set model.init_from=$TMP/gpt2_f32 --layout "pp=2" --layout "tp=2"
$EQ --name _hf_llama_tied --set model.init_from=$TMP/llama_tied_f16 --layout "pp=2"

# --- bytes read: each of 2 tensor-parallel (or pipeline) ranks reads about half the tensor bytes
# (the replicated norms are read by both; under pp the stages split the layers and the two
# vocabulary tables, untied llama)
bytes_share() { # NAME LAYOUT_SETS...: every rank's figure within [0.4, 0.65] of the total
    local name=$1
    shift
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/run.yaml --set model.init_from=$TMP/llama_f32 \
        --set checkpoint.dir=$TMP/$name-ck --set checkpoint.every=0 --set data.val=null "$@" \
        >$TMP/$name.log 2>&1 ||
        { fail $name "run failed: $(tail -2 $TMP/$name.log)"; return; }
    python3 - $name $TMP/$name.log <<'EOF'
import re, sys
name, log = sys.argv[1], open(sys.argv[2]).read()
got = [(int(a), int(b), int(c)) for a, b, c in
       re.findall(r"rank (\d+): imported \S+: read (\d+) of the files' (\d+) tensor bytes", log)]
ok = len(got) == 2 and all(0.4 * t <= b <= 0.65 * t for _, b, t in got)
figs = ", ".join(f"rank {r} {b}/{t} = {b / t:.3f}" for r, b, t in sorted(got))
print(f"PASS {name}: {figs}" if ok else f"FAIL {name}: {figs or 'no figures logged'}")
EOF
}
bytes_share hf_tp2_each_rank_reads_about_half --set parallel.tp=2
bytes_share hf_pp2_each_rank_reads_about_half --set parallel.pp=2
bytes_share hf_dp2_zero3_each_rank_reads_about_half --set parallel.dp=2 --set optimizer.zero_stage=3

# --- bad input: exit 2 naming the file / tensor / value, and the existing checkpoint untouched
$UST train $TMP/run.yaml --set model.init_from=$TMP/llama_f32 --set checkpoint.dir=$TMP/keep >/dev/null 2>&1
sum_before=$(find $TMP/keep -type f | sort | xargs md5sum | md5sum)
# bad NAME PATTERN DIR [--set ...]: training from DIR exits 2 matching PATTERN
bad() {
    local name=$1 pat=$2 dir=$3
    shift 3
    expect_exit $name 2 "$pat" -- $UST train $TMP/run.yaml --set model.init_from=$dir \
        --set checkpoint.dir=$TMP/keep --set checkpoint.resume=none "$@"
}
mkdir -p $TMP/not-hf
bad hf_dir_without_config_exits_2 "not a Hugging Face model directory \(no $TMP/not-hf/config.json\)" $TMP/not-hf
rm -rf $TMP/b-dup && cp -r $TMP/llama_f32 $TMP/b-dup &&
    python3 -c "import sys; p=sys.argv[1]; s=open(p).read().rstrip(); open(p,'w').write(s[:-1] + ', \"hidden_size\": 128}')" $TMP/b-dup/config.json
bad hf_config_key_twice_exits_2 "b-dup/config.json: key 'hidden_size' appears twice" $TMP/b-dup
$MAKE make llama $TMP/b-arch --set 'architectures=["Phi3ForCausalLM"]'
bad hf_unsupported_architecture_exits_2 "architecture 'Phi3ForCausalLM' is not supported" $TMP/b-arch
$MAKE make llama $TMP/b-rope --set 'rope_scaling={"rope_type": "longrope", "factor": 4.0}'
bad hf_unsupported_rope_type_exits_2 "b-rope/config.json: rope_scaling rope_type 'longrope' is not supported" $TMP/b-rope
$MAKE make llama $TMP/b-rope5 --set 'rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0}'
bad hf_unsupported_rope_parameters_exits_2 "rope_parameters rope_type 'dynamic' is not supported" $TMP/b-rope5
$MAKE make mixtral $TMP/b-window --set 'sliding_window=0'
bad hf_mixtral_sliding_window_0_exits_2 "b-window/config.json: 'sliding_window' = 0: a window is at least 1 key" $TMP/b-window
$MAKE make mixtral $TMP/b-aux --set 'router_aux_loss_coef=-0.5'
bad hf_mixtral_negative_aux_coef_exits_2 "b-aux/config.json: router_aux_loss_coef = -0.5: expected a finite value >= 0" $TMP/b-aux
$MAKE make qwen2 $TMP/b-qwin --set 'layer_types=["full_attention", "chunked_attention"]'
bad hf_qwen2_unknown_layer_type_exits_2 "layer_types\[1\] is chunked_attention; ustrain computes 'full_attention' and 'sliding_attention'" $TMP/b-qwin
$MAKE make llama $TMP/b-bias --set 'attention_bias=true'
bad hf_llama_attention_bias_exits_2 "'attention_bias': true is not supported" $TMP/b-bias
$MAKE make llama $TMP/b-act --set 'hidden_act="gelu"'
bad hf_llama_hidden_act_exits_2 "hidden_act 'gelu' is not supported" $TMP/b-act
# an escaped NUL would cut "silu\u0000gelu" to "silu" (issue 33): every HF reader refuses it
$MAKE make llama $TMP/b-nul-act --set 'hidden_act="silu\u0000gelu"'
bad hf_nul_in_hidden_act_exits_2 "b-nul-act/config.json:[0-9]+:[0-9]+: 'hidden_act' holds an escaped NUL" $TMP/b-nul-act
$MAKE make llama $TMP/b-nul-arch --set 'architectures=["LlamaForCausalLM\u0000Mistral"]'
bad hf_nul_in_architectures_exits_2 "'architectures' holds an escaped NUL .* \"LlamaForCausalLM.u0000Mistral\"" $TMP/b-nul-arch
$MAKE make llama $TMP/b-nul-rope --set 'rope_parameters={"rope_type": "default\u0000yarn", "rope_theta": 10000.0}'
bad hf_nul_in_rope_type_exits_2 "'rope_type' holds an escaped NUL" $TMP/b-nul-rope
expect_exit hf_nul_eval_exits_2 2 "'hidden_act' holds an escaped NUL" -- \
    $UST eval $TMP/b-nul-act --data "$TMP/data/val_*.bin" --steps 1 --seq-len 16
expect_exit hf_nul_generate_exits_2 2 "'rope_type' holds an escaped NUL" -- \
    $UST generate $TMP/b-nul-rope --prompt ab --tokenizer bytes --max-new-tokens 2
$MAKE make llama $TMP/b-nul-index --shards 2
python3 -c "import sys; p=sys.argv[1]; s=open(p).read(); open(p,'w').write(s.replace('.safetensors\"', '.safetensors\\\\u0000x\"', 1))" \
    $TMP/b-nul-index/model.safetensors.index.json
bad hf_nul_in_index_shard_name_exits_2 "model.safetensors.index.json:[0-9]+:[0-9]+: '[^']+' holds an escaped NUL" $TMP/b-nul-index
# an index entry must be in its shard and used (issue 33 item 5): layer 7 of a 2-layer model
$MAKE make llama $TMP/b-index-extra --shards 2
python3 -c "
import json, sys; p = sys.argv[1]; j = json.load(open(p))
j['weight_map']['model.layers.7.mlp.up_proj.weight'] = 'model-00001-of-00002.safetensors'
json.dump(j, open(p, 'w'))" $TMP/b-index-extra/model.safetensors.index.json
bad hf_index_entry_no_shard_holds_exits_2 "index.json: tensor 'model.layers.7.mlp.up_proj.weight' is listed in shard 'model-00001-of-00002.safetensors', which does not hold it" $TMP/b-index-extra
# a NaN weight (issue 33 item 4): the import counts and names it and refuses, exit 2, in train,
# eval and generate; allowed, it reaches the loss through attention (a NaN q row), exit 1
$MAKE make llama $TMP/b-nan
python3 -c "
import sys, numpy as np
from safetensors.numpy import load_file, save_file
p = sys.argv[1] + '/model.safetensors'; t = load_file(p)
w = t['model.layers.0.self_attn.q_proj.weight'].copy(); w[3, 5] = np.nan
t['model.layers.0.self_attn.q_proj.weight'] = w; save_file(t, p, metadata={'format': 'pt'})" $TMP/b-nan
NANPAT="tensor model.layers.0.self_attn.q_proj.weight .* holds 1 non-finite value"
bad hf_nan_weight_train_exits_2 "$NANPAT" $TMP/b-nan
expect_exit hf_nan_weight_eval_exits_2 2 "$NANPAT" -- \
    $UST eval $TMP/b-nan --data "$TMP/data/val_*.bin" --steps 1 --seq-len 16
expect_exit hf_nan_weight_generate_exits_2 2 "$NANPAT" -- \
    $UST generate $TMP/b-nan --prompt ab --tokenizer bytes --max-new-tokens 2
expect_exit hf_nan_weight_allowed_eval_loss_is_not_finite 1 "loss is not finite" -- \
    $UST eval $TMP/b-nan --data "$TMP/data/val_*.bin" --steps 1 --seq-len 16 \
    --set model.allow_nonfinite=true
expect_exit hf_nan_weight_allowed_generate_is_not_finite 1 "non-finite|NaN" -- \
    $UST generate $TMP/b-nan --prompt ab --tokenizer bytes --max-new-tokens 2 --allow-nonfinite
# messages name what is wrong (issue 33 item 8): an untied model without lm_head.weight names the
# tensor, not a count; a config.json that is no file is named by every command, generate included
$MAKE make llama_tied $TMP/b-nolm --set 'tie_word_embeddings=false'
bad hf_missing_lm_head_is_named_exits_2 "model.safetensors: tensor 'lm_head.weight' \(which LlamaForCausalLM needs\) is missing" $TMP/b-nolm
$MAKE make llama_tied $TMP/b-nolm2 --set 'tie_word_embeddings=false' --shards 2
expect_exit hf_missing_lm_head_sharded_generate_names_it 2 "index.json: tensor 'lm_head.weight' \(which LlamaForCausalLM needs\) is missing" -- \
    $UST generate $TMP/b-nolm2 --prompt ab --tokenizer bytes --max-new-tokens 2
for k in fifo zero dir; do
    rm -rf $TMP/b-cfg-$k && $MAKE make llama $TMP/b-cfg-$k && rm $TMP/b-cfg-$k/config.json
done
mkfifo $TMP/b-cfg-fifo/config.json && ln -s /dev/zero $TMP/b-cfg-zero/config.json && mkdir $TMP/b-cfg-dir/config.json
for k in "fifo a FIFO" "zero a character device" "dir a directory"; do
    set -- $k
    expect_exit hf_config_json_${1}_generate_names_it 2 "b-cfg-$1/config.json: not a regular file \(${*:2}\)" -- \
        timeout 20 $UST generate $TMP/b-cfg-$1 --prompt ab --tokenizer bytes --max-new-tokens 2
done
expect_exit hf_config_json_fifo_eval_names_it 2 "b-cfg-fifo/config.json: not a regular file \(a FIFO\)" -- \
    timeout 20 $UST eval $TMP/b-cfg-fifo --data "$TMP/data/val_*.bin" --steps 1 --seq-len 16
bad hf_config_json_fifo_train_names_it "b-cfg-fifo/config.json: not a regular file \(a FIFO\)" $TMP/b-cfg-fifo
$MAKE make llama $TMP/b-hd --set 'head_dim=32'
bad hf_head_dim_mismatch_exits_2 "head_dim 32 is not hidden_size / num_attention_heads = 64 / 4" $TMP/b-hd
$MAKE make gpt2 $TMP/b-gelu --set 'activation_function="gelu"'
bad hf_gpt2_activation_exits_2 "activation_function 'gelu' is not supported" $TMP/b-gelu
$MAKE make mixtral $TMP/b-count --set 'num_hidden_layers=4000' --set 'num_local_experts=4000'
bad hf_config_implying_more_tensors_than_files_exits_2 "b-count/config.json implies 48028003 tensors \(a MixtralForCausalLM of 4000 layers\), but the safetensors files hold 41" $TMP/b-count
$MAKE make llama $TMP/b-shard --shards 3
rm $TMP/b-shard/model-00002-of-00003.safetensors
bad hf_missing_shard_exits_2 "names shard 'model-00002-of-00003.safetensors' \(for tensor '[^']+'\), but .* is missing" $TMP/b-shard
$MAKE make llama $TMP/b-shape --bad-shape model.layers.1.mlp.up_proj.weight
bad hf_tensor_wrong_shape_exits_2 "tensor 'model.layers.1.mlp.up_proj.weight' has shape \[97, 64\] but .*config.json implies \[96, 64\]" $TMP/b-shape
$MAKE make llama $TMP/b-dtype --bad-dtype model.norm.weight=F99
bad hf_unknown_dtype_exits_2 "tensor 'model.norm.weight' has unknown dtype 'F99'" $TMP/b-dtype
$MAKE make llama $TMP/b-i32 --bad-dtype model.norm.weight=I32
bad hf_unsupported_dtype_exits_2 "tensor 'model.norm.weight' has dtype I32 \(ustrain imports F32, BF16, F16 and block-scaled F8_E4M3\)" $TMP/b-i32
$MAKE make llama $TMP/b-trunc
truncate -s 5000 $TMP/b-trunc/model.safetensors
bad hf_truncated_file_exits_2 "b-trunc/model.safetensors: tensor '[^']+' data_offsets .* run past the end of the file" $TMP/b-trunc
$MAKE make llama $TMP/b-extra --set 'tie_word_embeddings=true'
bad hf_tensor_config_does_not_explain_exits_2 "tensor 'lm_head.weight' is not part of a LlamaForCausalLM with this config.json" $TMP/b-extra
bad hf_explicit_key_disagrees_exits_2 "model.n_layer: the config sets 3 but $TMP/llama_f32/config.json \(num_hidden_layers / n_layer\) says 2" \
    $TMP/llama_f32 --set model.n_layer=3
bad hf_explicit_arch_disagrees_exits_2 "model.arch: the config sets llama but .*config.json \(architectures\) says gpt2" \
    $TMP/gpt2_f32 --set model.arch=llama
expect_exit hf_agreeing_explicit_keys_accepted 0 "step 0: val_loss" -- $UST train $TMP/run.yaml \
    --set model.init_from=$TMP/llama_f32 --set model.arch=llama --set model.n_layer=2 \
    --set model.n_kv_head=2 --set checkpoint.dir=$TMP/agree
[ "$(find $TMP/keep -type f | sort | xargs md5sum | md5sum)" = "$sum_before" ] &&
    [ "$(ls $TMP/keep | tr '\n' ' ')" = "latest step_0 " ] &&
    pass hf_bad_input_leaves_checkpoint_untouched || fail hf_bad_input_leaves_checkpoint_untouched "$(ls -A $TMP/keep)"

# --- transformers itself: its own tiny models, its loss on the same windows
if need_py hf_import_transformers_comparison torch transformers; then
    # fp32 on both sides over the same 128 targets; the export of each import loads back into
    # transformers (Qwen2ForCausalLM for the biases, rope_scaling for llama3) with the same loss
    for k in llama llama_tied llama3 qwen2 mixtral gpt2; do
        loss_both_ways $k ${k}_hf
    done
fi
exit 0
