#!/usr/bin/env bash
# DeepSeek-V3's multi-token prediction (model.mtp): two modules on a tiny llama. Their validation
# losses after 3 steps equal a torch reference written from the paper's equations
# (test/tools/mtp_ref.py), and so does the main model's; the main loss of step 1 is the one of
# the same model without modules; every layout trains the one-process losses and weights (dp
# ZeRO-2/3 with the vocabulary-chunked head, tp with and without sp, cp across the shifted
# tokens' chunk boundaries, pp with the embeddings passed to the last stage (1f1b, afab, zb,
# dualpipe and dualpipev), MLA blocks under tp+sp+cp; MoE blocks (DeepSeek-V3's) against the
# reference and under dp2 x ep2, dp2 ZeRO-3, pp2 and tp2+sp); the memory plan equals the arena; bad
# configs exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-mtp 4 2
sed -i "s/max_seq_len: 64}/max_seq_len: 64, mtp: {depth: 2, loss_weight: 0.3}}/" $TMP/llama.yaml
EQ="python3 test/tools/equiv.py --steps 4"
R="--set checkpoint.resume=none --set checkpoint.every=0"

# the main model is untouched: step 1's cross-entropy with and without the modules
$UST train $TMP/llama.yaml $R --set train.steps=1 --set logging.metrics_file=$TMP/d2.jsonl >$TMP/d2.log 2>&1 ||
    fail mtp_trains "$(tail -2 $TMP/d2.log)"
$UST train $TMP/llama.yaml $R --set train.steps=1 --set model.mtp.depth=0 \
    --set logging.metrics_file=$TMP/d0.jsonl >$TMP/d0.log 2>&1 || fail mtp_depth0_trains "$(tail -2 $TMP/d0.log)"
python3 - $TMP <<'EOF2'
import json, sys
a = json.loads(open(f"{sys.argv[1]}/d2.jsonl").readline())
b = json.loads(open(f"{sys.argv[1]}/d0.jsonl").readline())
ok = a["ce_loss"] == b["loss"] and "mtp_loss_2" in a and "mtp_loss_1" not in b
want = a["ce_loss"] + 0.3 / 2 * (a["mtp_loss_1"] + a["mtp_loss_2"])
ok = ok and abs(a["loss"] - want) <= 1e-7 * want  # the JSONL prints 9 digits
print("PASS mtp_main_loss_unchanged_and_modules_logged" if ok else
      f"FAIL mtp_main_loss_unchanged_and_modules_logged: {a} vs {b}")
EOF2

if need_py mtp_reference torch numpy safetensors; then
    $UST train $TMP/llama.yaml --set train.steps=3 --set "data.val=$TMP/data/val_*.bin" \
        --set data.val_every=3 --set data.val_steps=2 --set checkpoint.dir=$TMP/ck --set checkpoint.every=3 \
        --set logging.metrics_file=$TMP/ref.jsonl >$TMP/ref.log 2>&1 || fail mtp_reference_run "$(tail -2 $TMP/ref.log)"
    vl=$(grep -o '"val_loss":[0-9.]*' $TMP/ref.jsonl | tail -1 | cut -d: -f2)
    m1=$(grep -o '"val_mtp_loss_1":[0-9.]*' $TMP/ref.jsonl | tail -1 | cut -d: -f2)
    m2=$(grep -o '"val_mtp_loss_2":[0-9.]*' $TMP/ref.jsonl | tail -1 | cut -d: -f2)
    cat >$TMP/m.json <<EOT
{"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "vocab_size": 500, "norm_eps": 1e-5,
 "rope_theta": 10000, "depth": 2}
EOT
    python3 test/tools/mtp_ref.py mtp $TMP/ck/step_3 $TMP/m.json $TMP/data/val_000.bin 2 32 \
        "${vl:-0}" "$m1,$m2" 1e-5 2>&1 | grep -E '^(PASS|FAIL|  )'
    # generate ignores the modules; the export writes the main model only
    expect_exit mtp_generate_ignores_the_modules 0 "2 prompt tokens, 4 new tokens" -- \
        $UST generate $TMP/ck --prompt ab --max-new-tokens 4 --tokenizer bytes
    $UST export $TMP/ck --to hf $TMP/hf >$TMP/exp.log 2>&1 || fail mtp_export "$(tail -2 $TMP/exp.log)"
    python3 -c "import safetensors.numpy as s, sys; k = s.load_file(sys.argv[1]).keys(); print('PASS mtp_export_writes_the_main_model_only' if 'model.layers.1.mlp.up_proj.weight' in k and not [n for n in k if 'layers.2.' in n] else 'FAIL mtp_export_writes_the_main_model_only: %s' % sorted(k)[:5])" $TMP/hf/model.safetensors
fi

$EQ --name _mtp --config $TMP/llama.yaml --layout "dp=2 zero=3" --layout "dp=2 zero=2" \
    --layout "tp=2" --layout "tp=2 sp=true" --layout "cp=2" --layout "pp=2 sched=1f1b" \
    --layout "pp=2 sched=afab tp=2 sp=true"
MLA="mla: {enabled: true, q_lora_rank: 24, kv_lora_rank: 16, qk_nope_head_dim: 12, qk_rope_head_dim: 8, v_head_dim: 16}"
sed -e "s/max_seq_len: 64,/max_seq_len: 64, n_kv_head: 4, $MLA,/" -e "s/n_kv_head: 2,//" $TMP/llama.yaml >$TMP/mla.yaml
$EQ --name _mtp_mla --config $TMP/mla.yaml --layout "tp=2 sp=true cp=2 parallel.cp_layout=contiguous"

# zero-bubble and DualPipe(V) (the last stage's modules on rank 0 for V): the modules' backward is
# whole inside B, the lm_head's share of theirs a job of the head's W
$EQ --name _mtp_zb --config $TMP/llama.yaml --set train.global_batch_size=8 --layout "pp=2 sched=zb" \
    --layout "pp=2 sched=zb dp=2 zero=2"
sed -e 's/n_layer: 2/n_layer: 4/' $TMP/llama.yaml >$TMP/mtp4.yaml
$EQ --name _mtp_dualpipe --config $TMP/mtp4.yaml --layout "pp=2 vpp=2 sched=dualpipev" \
    --layout "pp=2 vpp=2 sched=dualpipe"
$EQ --name _mtp_dpv_dp --config $TMP/mtp4.yaml --set train.global_batch_size=8 \
    --layout "pp=2 vpp=2 sched=dualpipev dp=2 zero=2"

# MoE blocks (DeepSeek-V3's MTP layer is a MoE layer): layer 0 dense, layer 1 and the modules'
# blocks 4 experts in 2 groups, sigmoid scores, the balancing bias moving, the sequence-wise loss,
# a shared expert; the validation losses equal mtp_ref.py's (its own DeepSeek MoE) and ep2 x dp2,
# pp2 (the modules' experts on the last stage) and tp2+sp train one process's losses and weights
MOE="moe: {num_experts: 8, top_k: 2, d_ff_expert: 32, first_dense: 1, score: sigmoid, n_group: 4, topk_group: 2, routed_scale: 2.5, shared_expert: true, shared_d_ff: 48, aux_loss_coef: 0, seq_aux_loss_coef: 0.01, bias_update_rate: 0.05}"
sed -e "s/max_seq_len: 64,/max_seq_len: 64, $MOE,/" $TMP/llama.yaml >$TMP/moe.yaml
if need_py mtp_moe_reference torch numpy safetensors; then
    $UST train $TMP/moe.yaml --set train.steps=3 --set "data.val=$TMP/data/val_*.bin" \
        --set data.val_every=3 --set data.val_steps=2 --set checkpoint.dir=$TMP/ckm --set checkpoint.every=3 \
        --set logging.metrics_file=$TMP/refm.jsonl >$TMP/refm.log 2>&1 || fail mtp_moe_reference_run "$(tail -2 $TMP/refm.log)"
    vl=$(grep -o '"val_loss":[0-9.]*' $TMP/refm.jsonl | tail -1 | cut -d: -f2)
    m1=$(grep -o '"val_mtp_loss_1":[0-9.]*' $TMP/refm.jsonl | tail -1 | cut -d: -f2)
    m2=$(grep -o '"val_mtp_loss_2":[0-9.]*' $TMP/refm.jsonl | tail -1 | cut -d: -f2)
    cat >$TMP/mm.json <<EOT
{"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "vocab_size": 500, "norm_eps": 1e-5,
 "rope_theta": 10000, "depth": 2, "top_k": 2, "n_group": 4, "topk_group": 2, "routed_scale": 2.5}
EOT
    python3 -c "import safetensors.numpy as s, sys; k = s.load_file(sys.argv[1]); b = k['model.layers.3.mlp.router.expert_bias']; print('PASS mtp_moe_block_has_experts_and_a_moving_bias' if 'model.layers.3.mlp.experts.7.down_proj.weight' in k and abs(b).max() > 0 else 'FAIL mtp_moe_block_has_experts_and_a_moving_bias: %s' % b)" $TMP/ckm/step_3/model.safetensors
    python3 -c "import json, sys; r = json.loads(open(sys.argv[1]).readlines()[-1]); l = [x['layer'] for x in r['moe']]; print('PASS mtp_moe_blocks_in_the_moe_metrics' if l == [1, 2, 3] else 'FAIL mtp_moe_blocks_in_the_moe_metrics: layers %s' % l)" $TMP/refm.jsonl
    python3 test/tools/mtp_ref.py mtp_moe $TMP/ckm/step_3 $TMP/mm.json $TMP/data/val_000.bin 2 32 \
        "${vl:-0}" "$m1,$m2" 1e-5 2>&1 | grep -E '^(PASS|FAIL|  )'
fi
$EQ --name _mtp_moe --config $TMP/moe.yaml --layout "dp=2 ep=2" --layout "dp=2 zero=3" --layout "pp=2 sched=1f1b" \
    --layout "tp=2 sp=true"
plan_matches_arena mtp_moe_plan_equals_arena_ep2 $TMP/moe.yaml 2 --set parallel.dp=2 --set parallel.ep=2 \
    --set train.steps=2 $R

plan_matches_arena mtp_plan_equals_arena_tp2_sp $TMP/llama.yaml 2 --set parallel.tp=2 --set parallel.sp=true \
    --set train.steps=2 $R

# bad input
expect_exit mtp_depth_beyond_sequence_exits_2 2 "model.mtp.depth 4 reaches beyond the sequence" -- \
    $UST validate $TMP/llama.yaml --set model.mtp.depth=4 --set train.seq_len=4
expect_exit mtp_gpt2_exits_2 2 "model.mtp.depth 1 applies to llama" -- \
    $UST validate $TMP/gpt2.yaml --set model.mtp.depth=1
expect_exit mtp_weight_zero_exits_2 2 "model.mtp.loss_weight" -- \
    $UST validate $TMP/llama.yaml --set model.mtp.loss_weight=0
exit 0
