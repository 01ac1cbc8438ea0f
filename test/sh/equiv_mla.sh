#!/usr/bin/env bash
# Multi-head latent attention (model.mla) in the equivalence harness: every layout trains the
# same losses as one process. tp splits the heads and sums the replicated down-projections'
# gradients (the q latent on and off), cp exchanges the re-expanded per-head K/V in both
# layouts, pp runs 1f1b, zb and dualpipev (B/W split: the latents' weight gradients deferred, under
# tp the replicated ones summed after W), dp shards with ZeRO-3.
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
# zero-bubble's and DualPipe's split backward: W adds the latents' weight gradients later, under
# tp the replicated ones through the scratch summed over the group
$EQ --name _mla_zb --config $TMP/llama.yaml --layout "pp=2 sched=zb" --layout "pp=2 sched=zb tp=2 sp=true"
sed -e 's/n_layer: 2/n_layer: 4/' $TMP/llama.yaml >$TMP/mla4.yaml
$EQ --name _mla_dpv --config $TMP/mla4.yaml --layout "pp=2 vpp=2 sched=dualpipev"
$EQ --name _mla_zb_noq --config $TMP/noq.yaml --layout "pp=2 sched=zb tp=2"
plan_matches_arena mla_zb_plan_equals_arena_pp2 $TMP/llama.yaml 2 --set parallel.pp=2 \
    --set parallel.pp_schedule=zb --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=0
exit 0
