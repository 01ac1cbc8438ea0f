#!/usr/bin/env bash
# Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3's attention, dense and MoE layers mixed by
# decoder_sparse_step / mlp_only_layers, softmax top-k with or without norm_topk_prob) and
# DeepSeek-V3's routing against transformers (helpers: test/hf_lib.sh). A numpy-made directory
# (decoder_sparse_step 2: layer 0 dense, layer 1 MoE) imports and exports bit-identically and
# trains the one-process losses under ep, tp+sp and pp across the dense/MoE boundary;
# transformers' own tiny model (4 layers, mlp_only_layers [0, 2], norm_topk_prob false) gives
# ustrain's loss within 1e-5 relative, greedy generate picks the same 32 tokens, and the exports
# after 10 steps under dp=2 x tp=2 and pp=2 load with every key used and give ustrain's loss.
# DeepSeek-V3's routing (sigmoid, a moved balancing bias, 2 of 4 groups, routed scale, a shared
# expert of its own width, a dense first layer) equals transformers' DeepseekV3MoE on the same
# weights (test/tools/moe_deepseek_ref.py). Bad configs exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"
need_py hf_qwen3_moe_python_deps numpy || exit 0
. "$(dirname "$0")/../hf_lib.sh"

roundtrip qwen3_moe_f32 qwen3_moe
python3 - $TMP <<'EOF'
import json, sys
a = json.load(open(f"{sys.argv[1]}/qwen3_moe_f32-out/config.json"))
ok = (a["architectures"] == ["Qwen3MoeForCausalLM"] and a["model_type"] == "qwen3_moe" and
      a["mlp_only_layers"] == [0] and a["decoder_sparse_step"] == 1 and a["norm_topk_prob"] and
      a["moe_intermediate_size"] == 48 and a["intermediate_size"] == 96 and a["num_experts"] == 4)
print("PASS qwen3_moe_exports_as_qwen3_moe" if ok else f"FAIL qwen3_moe_exports_as_qwen3_moe: {a}")
EOF
expect_exit qwen3_moe_validate_says_which_layers 0 "moe: 4 experts, top-2 of softmax scores, gates renormalized x 1; experts d_ff 48; MoE layers 1 of 2 \(1 dense, d_ff 96\)" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/qwen3_moe_f32
$EQ --name _hf_qwen3_moe --set model.init_from=$TMP/qwen3_moe_f32 --layout "dp=2 ep=2" \
    --layout "tp=2 sp=true" --layout "pp=2"

if need_py hf_qwen3_moe_transformers torch transformers; then
    versus_transformers qwen3_moe
    # DeepSeek-V3's router and MoE block: 4 steps with a fast-moving bias, then transformers'
    # DeepseekV3MoE on the step-4 weights over the validation windows
    sed -e 's/steps: 0/steps: 4/' -e 's/val_steps: 2}/val_steps: 2, val_every: 4}/' $TMP/run.yaml >$TMP/ds.yaml
    D="--set model.arch=llama --set model.n_layer=3 --set model.d_model=64 --set model.n_head=4"
    D="$D --set model.n_kv_head=2 --set model.d_ff=96 --set model.vocab_size=300 --set model.max_seq_len=64"
    D="$D --set model.qk_norm=true --set model.moe.num_experts=8 --set model.moe.top_k=2"
    D="$D --set model.moe.d_ff_expert=32 --set model.moe.first_dense=1 --set model.moe.score=sigmoid"
    D="$D --set model.moe.n_group=4 --set model.moe.topk_group=2 --set model.moe.routed_scale=2.5"
    D="$D --set model.moe.shared_expert=true --set model.moe.shared_d_ff=64 --set model.moe.aux_loss_coef=0"
    D="$D --set model.moe.seq_aux_loss_coef=0.01 --set model.moe.bias_update_rate=0.05"
    $UST train $TMP/ds.yaml $D --set checkpoint.dir=$TMP/ds-ck --set checkpoint.every=4 \
        --set logging.metrics_file=$TMP/ds.jsonl >$TMP/ds.log 2>&1 || fail deepseek_routing_trains "$(tail -2 $TMP/ds.log)"
    vl=$(grep -o '"val_loss":[0-9.]*' $TMP/ds.jsonl | tail -1 | cut -d: -f2)
    cat >$TMP/ds.json <<EOT
{"n_layer": 3, "d_model": 64, "n_head": 4, "n_kv_head": 2, "d_ff": 96, "vocab_size": 300,
 "experts": 8, "top_k": 2, "d_ff_expert": 32, "n_shared": 2, "n_group": 4, "topk_group": 2,
 "routed_scale": 2.5, "first_dense": 1, "norm_eps": 1e-5, "rope_theta": 10000, "max_seq_len": 64}
EOT
    python3 test/tools/moe_deepseek_ref.py deepseek_routing $TMP/ds-ck/step_4 $TMP/ds.json \
        $TMP/data/val_000.bin 4 32 "${vl:-0}" 1e-5 2>&1 | grep -E '^(PASS|FAIL|  )'
    expect_exit deepseek_routing_has_no_qwen3_moe_layout_exits_2 2 "model.moe: the Hugging Face layouts for mixture of experts are Mixtral's" -- \
        $UST export $TMP/ds-ck/step_4 --to hf $TMP/ds-out
fi

# bad input
$MAKE make qwen3_moe $TMP/b-q3m-win --set 'use_sliding_window=true' --set 'sliding_window=8'
expect_exit qwen3_moe_sliding_window_exits_2 2 "b-q3m-win/config.json: 'use_sliding_window': true is not supported" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-q3m-win --set checkpoint.dir=$TMP/b
$MAKE make qwen3_moe $TMP/b-q3m-only --set 'mlp_only_layers=[5]'
expect_exit qwen3_moe_mlp_only_layer_out_of_range_exits_2 2 "b-q3m-only/config.json: mlp_only_layers\[0\] is not a layer index in 0..1" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-q3m-only --set checkpoint.dir=$TMP/b
expect_exit qwen3_moe_config_disagrees_exits_2 2 "model.moe.norm_topk: the config sets false but .*norm_topk_prob\) says true" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/qwen3_moe_f32 --set model.moe.norm_topk=false \
    --set checkpoint.dir=$TMP/b
exit 0
