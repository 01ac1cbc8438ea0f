#!/usr/bin/env bash
# DeepSeek-V3's multi-token prediction (model.mtp): two modules on a tiny llama. Their validation
# losses after 3 steps equal a torch reference written from the paper's equations
# (test/tools/mtp_ref.py), and so does the main model's; the main loss of step 1 is the one of
# the same model without modules; every layout trains the one-process losses and weights (dp
# ZeRO-2/3 with the vocabulary-chunked head, tp with and without sp, cp across the shifted
# tokens' chunk boundaries, pp with the embeddings passed to the last stage (1f1b, afab, zb,
# dualpipe and dualpipev), MLA blocks under tp+sp+cp); the memory plan equals the arena; bad
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
