#!/usr/bin/env bash
# DeepSeek-V3 against transformers (docs/deepseek.md): tiny random DeepseekV3ForCausalLM models
# built by transformers' own class, rope_interleave true. Dense (first_k_dense_replace = layers),
# with the q latent (q_lora_rank 24; YaRN factor 4 over 16 positions with DeepSeek's mscale 1 /
# mscale_all_dim 1: the softmax scale x 1.296) and without (null, no scaling); and with a DeepSeek
# MoE layer (layer 0 dense, layer 1: 8 experts in 4 groups, top-2 from the best 2 groups by
# sigmoid score + a non-zero correction bias, routed scale 2.5, a shared MLP of 2 x 24). For each:
# the import's loss within 1e-5 relative of transformers', greedy generate token-identical for 32
# tokens (the latent cache), and the export bit-identical to the import and loaded by
# transformers with every key used and the same loss; 10 trained steps exported and checked
# (hf_lib.sh's trained_export): dense under dp=2 x tp=2 and pp=2, MoE under dp=2 x ep=2 with the
# balancing bias moving and pp=2 across the dense/MoE boundary. MTP layers, dense and (in the MoE
# model) MoE blocks, against mtp_ref.py hf. Bad configs exit 2.
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

# with DeepSeek MoE layers
k=deepseek_v3_moe
m=$TMP/tf-$k
if loss_both_ways $k $k; then
    $MAKE compare ${k}_export $m $m-out
    greedy_generate $k $m
    trained_export ${k}_trained_dp2_ep2 $m 2 --set parallel.dp=2 --set parallel.ep=2 \
        --set model.moe.bias_update_rate=0.01
    trained_export ${k}_trained_pp2 $m 2 --set parallel.pp=2
fi

# FP8 block-quantized (DeepSeek-V3's release format, made by torch: test/tools/hf_fp8.py): the
# import dequantizes to exactly torch's fp8.float() * scale (the export is bit-identical to the
# fp32 reference) and trains the reference's loss; bad scales exit 2 naming the tensor
val_loss() { # val_loss DIR: ustrain's step-0 validation loss of Hugging Face model DIR
    $UST train $TMP/run.yaml --set model.init_from=$1 --set checkpoint.dir=$1-ck 2>&1 |
        sed -n 's/^step 0: val_loss \([0-9.]*\).*/\1/p'
}
if python3 test/tools/hf_fp8.py $m $TMP/fp8 $TMP/fp8-ref; then
    l8=$(val_loss $TMP/fp8)
    lr=$(val_loss $TMP/fp8-ref)
    [ -n "$l8" ] && [ "$l8" = "$lr" ] && pass deepseek_v3_fp8_loss_equals_dequantized_reference ||
        fail deepseek_v3_fp8_loss_equals_dequantized_reference "fp8 '$l8' vs reference '$lr'"
    $UST export $TMP/fp8-ck/step_0 --to hf $TMP/fp8-out >/dev/null 2>&1
    $MAKE compare deepseek_v3_fp8_dequantized $TMP/fp8-ref $TMP/fp8-out
else
    fail deepseek_v3_fp8_made_by_torch "hf_fp8.py failed"
fi
n=model.layers.1.self_attn.kv_b_proj.weight_scale_inv
for brk in missing-scale scale-shape scale-inf no-config; do
    python3 test/tools/hf_fp8.py $m $TMP/fp8-$brk $TMP/fp8-$brk-ref --break $brk
done
expect_exit deepseek_v3_fp8_missing_scale_exits_2 2 "tensor '$n' \(the block scales of F8_E4M3 tensor 'model.layers.1.self_attn.kv_b_proj.weight'\) is missing" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/fp8-missing-scale --set checkpoint.dir=$TMP/b
expect_exit deepseek_v3_fp8_scale_shape_exits_2 2 "tensor '$n' is F32 \[6, 2\], but the scales of a \[112, 16\] weight in blocks of \[16, 8\] \(quantization_config.weight_block_size\) are F32 \[7, 2\]" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/fp8-scale-shape --set checkpoint.dir=$TMP/b
expect_exit deepseek_v3_fp8_scale_inf_exits_2 2 "tensor '$n' holds a non-finite scale \(inf, block 5 of 14\)" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/fp8-scale-inf --set checkpoint.dir=$TMP/b
expect_exit deepseek_v3_fp8_without_quantization_config_exits_2 2 "is F8_E4M3 but config.json has no quantization_config" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/fp8-no-config --set checkpoint.dir=$TMP/b

patched() { # patched NAME JSON_PATCH: $TMP/b-NAME = the MoE model with its config.json patched
    mkdir -p $TMP/b-$1 && cp $m/model.safetensors $TMP/b-$1/
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update(json.loads(sys.argv[2])); json.dump(c, open(sys.argv[3], "w"))' \
        $m/config.json "$2" $TMP/b-$1/config.json
}
# routed_scaling_factor 1 is written 1.0: transformers' strict DeepseekV3Config refuses an int
patched scale1 '{"routed_scaling_factor": 1.0}'
vl=$(val_loss $TMP/b-scale1)
$UST export $TMP/b-scale1-ck/step_0 --to hf $TMP/b-scale1-out >/dev/null 2>&1
python3 test/tools/hf_export_check.py transformers deepseek_v3_moe_scale_1_export $TMP/b-scale1-out \
    $TMP/data/val_000.bin 4 32 "$vl" 1e-5 2>&1 | grep -E '^(PASS|FAIL|  )'

# DeepSeek's multi-token prediction layers (model.layers.{2,3}, num_nextn_predict_layers 2, written
# with safetensors beside transformers' main model: hf_make_model.py add_mtp_layers) import into
# model.mtp: the main and both modules' losses equal test/tools/mtp_ref.py's (the paper's
# equations around transformers' own blocks); the export is bit-identical and transformers loads
# it without unexpected keys (told to ignore those layers as it ignores DeepSeek-V3's layer 61);
# trained under pp2, the export's module losses are the run's; the copies of the embedding and
# head must equal the main ones; depth 0 imports the main model alone; bad depths exit 2
t=$TMP/tf-mtp
mtp_losses() { # mtp_losses LOG: "val_loss m1,m2" of a step-0 import's output
    echo "$(sed -n 's/^step 0: val_loss \([0-9.]*\).*/\1/p' $1)" \
        "$(sed -n 's/^step 0: val_mtp_loss_[0-9] \([0-9.]*\).*/\1/p' $1 | paste -sd,)"
}
if $MAKE transformers deepseek_v3_mtp $t >$t.log 2>&1; then
    $UST train $TMP/run.yaml --set model.init_from=$t --set checkpoint.dir=$t-ck >$t.run 2>&1
    python3 test/tools/mtp_ref.py hf deepseek_v3_mtp_import $t $TMP/data/val_000.bin 4 32 $(mtp_losses $t.run) 2>&1 |
        grep -E '^(PASS|FAIL|  )'
    $UST export $t-ck/step_0 --to hf $t-out >/dev/null 2>&1
    $MAKE compare deepseek_v3_mtp_export $t $t-out
    python3 test/tools/hf_export_check.py transformers deepseek_v3_mtp_export $t-out $TMP/data/val_000.bin 4 32 \
        "$(mtp_losses $t.run | cut -d' ' -f1)" 1e-5 2>&1 | grep -E '^(PASS|FAIL|  )'
    n=deepseek_v3_mtp_trained_pp2
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/run.yaml --set model.init_from=$t \
        --set checkpoint.dir=$TMP/$n-ck --set train.steps=6 --set data.val_every=6 --set parallel.pp=2 \
        --set logging.metrics_file=$TMP/$n.jsonl >$TMP/$n.log 2>&1 || fail ${n}_trains "$(tail -2 $TMP/$n.log)"
    $UST export $TMP/$n-ck --to hf $TMP/$n-out >/dev/null 2>&1
    python3 test/tools/mtp_ref.py hf $n $TMP/$n-out $TMP/data/val_000.bin 4 32 \
        $(python3 -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1])][-1]
print(r["val_loss"], "%s,%s" % (r["val_mtp_loss_1"], r["val_mtp_loss_2"]))' $TMP/$n.jsonl) 2>&1 | grep -E '^(PASS|FAIL)'
    $UST train $TMP/run.yaml --set model.init_from=$t --set model.mtp.depth=0 --set checkpoint.dir=$t-d0 >$t.d0 2>&1
    [ "$(mtp_losses $t.d0)" = "$(mtp_losses $t.run | cut -d' ' -f1) " ] &&
        pass deepseek_v3_mtp_depth_0_imports_the_main_model ||
        fail deepseek_v3_mtp_depth_0_imports_the_main_model "$(mtp_losses $t.d0) vs $(mtp_losses $t.run)"
    expect_exit deepseek_v3_mtp_deeper_than_the_files_exits_2 2 "model.mtp.depth: the config sets 3 but .*num_nextn_predict_layers\) has 2 multi-token prediction layers" -- \
        $UST train $TMP/run.yaml --set model.init_from=$t --set model.mtp.depth=3 --set checkpoint.dir=$TMP/b
    $MAKE transformers deepseek_v3_mtp_dupdiff $t-dd >/dev/null 2>&1
    expect_exit deepseek_v3_mtp_head_copy_differs_exits_2 2 "tensor 'model.layers.3.shared_head.head.weight' differs from 'lm_head.weight' \(element 451: " -- \
        $UST train $TMP/run.yaml --set model.init_from=$t-dd --set checkpoint.dir=$TMP/b
else
    fail deepseek_v3_mtp_builds "$(tail -1 $t.log)"
fi

# MTP over MoE layers, as DeepSeek-V3 itself: the MoE model with one MTP layer (model.layers.2)
# whose block is a MoE layer (hf_make_model.py deepseek_v3_moe_mtp: transformers'
# DeepseekV3DecoderLayer past first_k_dense_replace, a random correction bias): the import's main
# and module losses equal mtp_ref.py hf's (transformers' DeepseekV3MoE as the block), the export is
# bit-identical and loaded by transformers; trained 4 steps under dp2 x ep2 with the bias moving,
# the export's module loss is the run's
t=$TMP/tf-moe-mtp
if $MAKE transformers deepseek_v3_moe_mtp $t >$t.log 2>&1; then
    $UST train $TMP/run.yaml --set model.init_from=$t --set checkpoint.dir=$t-ck >$t.run 2>&1
    python3 test/tools/mtp_ref.py hf deepseek_v3_moe_mtp_import $t $TMP/data/val_000.bin 4 32 $(mtp_losses $t.run) 2>&1 |
        grep -E '^(PASS|FAIL|  )'
    $UST export $t-ck/step_0 --to hf $t-out >/dev/null 2>&1
    $MAKE compare deepseek_v3_moe_mtp_export $t $t-out
    python3 test/tools/hf_export_check.py transformers deepseek_v3_moe_mtp_export $t-out $TMP/data/val_000.bin 4 32 \
        "$(mtp_losses $t.run | cut -d' ' -f1)" 1e-5 2>&1 | grep -E '^(PASS|FAIL|  )'
    n=deepseek_v3_moe_mtp_trained_dp2_ep2
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/run.yaml --set model.init_from=$t \
        --set checkpoint.dir=$TMP/$n-ck --set train.steps=4 --set data.val_every=4 --set parallel.dp=2 \
        --set parallel.ep=2 --set model.moe.bias_update_rate=0.01 \
        --set logging.metrics_file=$TMP/$n.jsonl >$TMP/$n.log 2>&1 || fail ${n}_trains "$(tail -2 $TMP/$n.log)"
    $UST export $TMP/$n-ck --to hf $TMP/$n-out >/dev/null 2>&1
    python3 test/tools/mtp_ref.py hf $n $TMP/$n-out $TMP/data/val_000.bin 4 32 \
        $(python3 -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1])][-1]
print(r["val_loss"], r["val_mtp_loss_1"])' $TMP/$n.jsonl) 2>&1 | grep -E '^(PASS|FAIL)'
else
    fail deepseek_v3_moe_mtp_builds "$(tail -1 $t.log)"
fi

# bad input: attention biases; MoE routing transformers' class does not compute; no shared MLP;
# a layout DeepseekV3ForCausalLM cannot hold on export
patched bias '{"attention_bias": true}'
patched softmax '{"scoring_func": "softmax"}'
patched noshared '{"n_shared_experts": 0}'
expect_exit deepseek_v3_attention_bias_exits_2 2 "'attention_bias': true is not supported \(DeepseekV3ForCausalLM" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-bias --set checkpoint.dir=$TMP/b
expect_exit deepseek_v3_softmax_scoring_exits_2 2 "scoring_func 'softmax', topk_method 'noaux_tc', moe_layer_freq 1: DeepseekV3ForCausalLM routes by sigmoid" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-softmax --set checkpoint.dir=$TMP/b
expect_exit deepseek_v3_no_shared_experts_exits_2 2 "'n_shared_experts' = 0: ustrain's DeepSeek MoE layer has one shared MLP" -- \
    $UST train $TMP/run.yaml --set model.init_from=$TMP/b-noshared --set checkpoint.dir=$TMP/b
# trained from YAML with its MoE layer first: no first_k_dense_replace says that
sed -e 's/arch: auto, init_from: null/arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 4, d_ff: 96, vocab_size: 300, max_seq_len: 64, mla: {enabled: true, kv_lora_rank: 16, qk_nope_head_dim: 12, qk_rope_head_dim: 8, v_head_dim: 16}, moe: {num_experts: 4, top_k: 2, d_ff_expert: 24, layers: [1, 0], score: sigmoid, shared_expert: true}/' \
    $TMP/run.yaml >$TMP/mla-moe.yaml
$UST train $TMP/mla-moe.yaml --set checkpoint.dir=$TMP/mla-moe-ck >$TMP/mla-moe.log 2>&1 ||
    fail deepseek_v3_yaml_moe_trains "$(tail -2 $TMP/mla-moe.log)"
expect_exit deepseek_v3_export_moe_not_a_suffix_exits_2 2 "DeepseekV3ForCausalLM's MoE layers are every layer from first_k_dense_replace on; this model's are not \(first MoE layer 0 of 2\)" -- \
    $UST export $TMP/mla-moe-ck/step_0 --to hf $TMP/b-out
exit 0
