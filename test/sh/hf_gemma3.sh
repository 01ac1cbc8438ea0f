#!/usr/bin/env bash
# Gemma 3, text only (Gemma3ForCausalLM; docs/huggingface.md#gemma-3): GeGLU (model.hidden_act
# gelu_tanh), RMSNorms by (1 + w) (model.norm_offset), norms before and after attention and the
# MLP (model.sandwich_norm), per-head q/k norms, head_dim apart from d_model / n_head,
# query_pre_attn_scalar, embeddings times sqrt(d_model) (model.embed_scale), tied embeddings,
# local (windowed) and global layers from layer_types, each with its RoPE (model.rope_local_theta;
# the global layers' linear rope_scaling). Helpers: test/hf_lib.sh. A numpy-made directory imports
# and exports bit-identically; the import trains the one-process losses under tp (with sp), cp
# (ring and Ulysses: the windows cut), pp (1f1b and zero-bubble), dp ZeRO-3 and full recompute;
# against transformers' own tiny Gemma3ForCausalLM: the loss within 1e-5 relative, greedy
# generate token-identical for 32 tokens, and after 10 steps under dp=2 x tp=2 and pp=2 the
# export loads with every key used and gives ustrain's loss. Bad configs exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"
need_py hf_gemma3_python_deps numpy || exit 0
. "$(dirname "$0")/../hf_lib.sh"

roundtrip gemma3_bf16_sharded gemma3 --dtype bf16 --shards 2
python3 - $TMP <<'EOF2'
import json, sys
a = json.load(open(f"{sys.argv[1]}/gemma3_bf16_sharded-out/config.json"))
ok = (a["architectures"] == ["Gemma3ForCausalLM"] and a["model_type"] == "gemma3_text" and
      a["head_dim"] == 24 and a["query_pre_attn_scalar"] == 20 and a["layer_types"][2] ==
      "full_attention" and a["layer_types"][3] == "sliding_attention" and a["sliding_window"] == 8
      and a["rope_parameters"]["full_attention"]["rope_type"] == "linear"
      and a["rope_parameters"]["sliding_attention"]["rope_theta"] == 1e4)
print("PASS gemma3_exports_as_gemma3" if ok else f"FAIL gemma3_exports_as_gemma3: {a}")
EOF2
expect_exit gemma3_validate_reads_the_keys 0 "model: llama, 4 layers" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/gemma3_bf16_sharded
expect_exit gemma3_validate_prints_the_block 0 "block: GeGLU MLP, norms by \(1 \+ w\), norms before and after attention and the MLP, embeddings x sqrt\(d_model\), head_dim 24, logits / sqrt\(20\), windowed layers' rope theta 10000" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/gemma3_bf16_sharded
expect_exit gemma3_validate_prints_linear_rope 0 "rope: theta 1e\+06, linear scaling factor 2" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/gemma3_bf16_sharded
$EQ --name _hf_gemma3 --set model.init_from=$TMP/gemma3_bf16_sharded --layout "tp=2" \
    --layout "tp=2 sp=true dp=2 zero=1" --layout "cp=2" --layout "cp=2 parallel.cp_comm=a2a" \
    --layout "pp=2" --layout "pp=2 sched=zb" --layout "dp=2 zero=3" \
    --layout "tp=2 train.recompute=full"
if need_py hf_gemma3_transformers torch transformers; then
    versus_transformers gemma3
fi

# Gemma 2's soft-caps (model.attn_softcap, model.final_softcap; docs/huggingface.md#gemma-3):
# every layout trains the one-process losses with both caps (windows of 8 cut the cp ring), and
# transformers' own Gemma 3 with final_logit_softcapping 1.0 (its logits reach ~1.7) gives
# ustrain's loss on import and re-export, greedy generate's tokens, and generate's dumped logits
# stay inside the cap
$EQ --name _softcap --set model.arch=llama --set model.attn_softcap=0.3 \
    --set model.final_softcap=1.0 --set model.sliding_window=8 --layout "tp=2" --layout "cp=2" \
    --layout "cp=2 parallel.cp_comm=a2a" --layout "pp=2"
if need_py hf_gemma3_softcap_transformers torch transformers; then
    if loss_both_ways gemma3_softcap gemma3_softcap; then
        greedy_generate gemma3_softcap $TMP/tf-gemma3_softcap
        python3 - $TMP/tf-gemma3_softcap.logits <<'EOF2'
import sys, numpy as np
m = float(np.abs(np.fromfile(sys.argv[1], dtype=np.float32)).max())
print("PASS generate_logits_inside_final_softcap" if 0.5 < m < 1.0 else
      f"FAIL generate_logits_inside_final_softcap: max |logit| {m}, cap 1.0")
EOF2
        grep -q '"final_logit_softcapping":[[:space:]]*1\.0' $TMP/tf-gemma3_softcap-out/config.json &&
            pass gemma3_softcap_exports_final_cap ||
            fail gemma3_softcap_exports_final_cap "$(grep softcap $TMP/tf-gemma3_softcap-out/config.json)"
    fi
fi

# bad input
$MAKE make gemma3 $TMP/b-softcap --set 'attn_logit_softcapping=30.0'
expect_exit gemma3_attn_softcap_exits_2 2 "'attn_logit_softcapping' = 30 is not supported .*never applies it" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-softcap --set checkpoint.dir=$TMP/b
$MAKE make gemma3 $TMP/b-fcap --set 'final_logit_softcapping=-2.0'
expect_exit gemma3_negative_final_softcap_exits_2 2 "'final_logit_softcapping' = -2: expected a positive number" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-fcap --set checkpoint.dir=$TMP/b
expect_exit softcap_negative_exits_2 2 "model.attn_softcap: -1 is out of range" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.attn_softcap=-1
expect_exit softcap_on_cuda_validates 0 "final logits soft-capped: 30 tanh\(x / 30\)" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.final_softcap=30 --set run.device=cuda
expect_exit softcap_validate_prints_it 0 "attention scores soft-capped: 50 tanh\(s / 50\)" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.attn_softcap=50
$MAKE make gemma3 $TMP/b-vision --set 'architectures=["Gemma3ForConditionalGeneration"]'
expect_exit gemma3_vision_tower_exits_2 2 "'vision_config' .* is not supported" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-vision --set checkpoint.dir=$TMP/b
$MAKE make gemma3 $TMP/b-rope --set 'rope_parameters={"full_attention": {"rope_type": "dynamic", "factor": 2.0}, "sliding_attention": {"rope_type": "default"}}'
expect_exit gemma3_rope_type_exits_2 2 "full_attention rope_type 'dynamic' is not supported" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-rope --set checkpoint.dir=$TMP/b
expect_exit sandwich_norm_with_experts_exits_2 2 "model.sandwich_norm: true applies to a dense llama" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.sandwich_norm=true \
    --set model.moe.num_experts=4
expect_exit geglu_on_gpt2_exits_2 2 "model.hidden_act: gelu_tanh .* not gpt2" -- \
    $UST validate $TMP/eq.yaml --set model.arch=gpt2 --set model.hidden_act=gelu_tanh
expect_exit hidden_act_unknown_exits_2 2 "model.hidden_act" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.hidden_act=relu
expect_exit rope_local_theta_without_window_exits_2 2 "model.rope_local_theta 10000 is the RoPE base of windowed layers" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.rope_local_theta=10000
# the options run on CUDA too (test/sh/gemma_emulated.sh trains them there)
expect_exit gemma_on_cuda_validates 0 "block: GeGLU MLP, norms by \(1 \+ w\)" -- \
    $UST validate $TMP/eq.yaml --set model.arch=llama --set model.norm_offset=true \
    --set model.hidden_act=gelu_tanh --set run.device=cuda --set train.precision=bf16
# from YAML: GeGLU alone trains, but its only Hugging Face layout is Gemma 3's whole block
$UST train $TMP/eq.yaml --set model.arch=llama --set model.hidden_act=gelu_tanh --set train.steps=1 \
    --set checkpoint.dir=$TMP/gg-ck --set checkpoint.every=1 >$TMP/gg.log 2>&1 ||
    fail geglu_yaml_trains "$(tail -2 $TMP/gg.log)"
expect_exit geglu_alone_export_exits_2 2 "their Hugging Face layout is Gemma3ForCausalLM" -- \
    $UST export $TMP/gg-ck/step_1 --to hf $TMP/gg-out
exit 0
