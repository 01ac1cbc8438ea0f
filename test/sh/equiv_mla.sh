#!/usr/bin/env bash
# Multi-head latent attention (model.mla) in the equivalence harness: every layout trains the
# same losses as one process. tp splits the heads and sums the replicated down-projections'
# gradients (the q latent on and off), cp exchanges the re-expanded per-head K/V in both
# layouts, pp runs 1f1b, dp shards with ZeRO-3.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-mla 4 4
MLA="mla: {enabled: true, q_lora_rank: 24, kv_lora_rank: 16, qk_nope_head_dim: 12, qk_rope_head_dim: 8, v_head_dim: 16}"
sed -i "s/max_seq_len: 64}/max_seq_len: 64, $MLA}/" $TMP/llama.yaml
sed -e "s/q_lora_rank: 24/q_lora_rank: 0/" $TMP/llama.yaml >$TMP/noq.yaml
EQ="python3 test/tools/equiv.py --steps 6"

$EQ --name _mla --config $TMP/llama.yaml --layout "dp=2 zero=3" --layout "tp=2" \
    --layout "tp=2 sp=true" --layout "pp=2 sched=1f1b" --layout "cp=2" \
    --layout "cp=2 parallel.cp_layout=contiguous" --layout "tp=2 sp=true dp=2 zero=3"
$EQ --name _mla_noq --config $TMP/noq.yaml --layout "tp=2 sp=true" --layout "cp=2 parallel.cp_comm=allgather"

plan_matches_arena mla_plan_equals_arena_tp2_sp $TMP/llama.yaml 2 --set parallel.tp=2 --set parallel.sp=true \
    --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=0
expect_exit mla_zb_schedule_exits_2 2 "model.mla under parallel.pp_schedule: zb is not supported" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.pp_schedule=zb --world 2
exit 0
