#!/usr/bin/env bash
# Multi-head latent attention (model.mla) in the equivalence harness: every layout trains the
# same losses as one process. tp splits the heads and sums the replicated down-projections'
# gradients (the q latent on and off), cp passes the latent in both layouts and re-expands it
# (the latent ring; per-head K/V with cp_latent off, and the bytes of both by hand), pp runs
# 1f1b, zb and dualpipev (B/W split: the latents' weight gradients deferred, under tp the
# replicated ones summed after W), dp shards with ZeRO-3.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-mla 4 4
MLA="mla: {enabled: true, q_lora_rank: 24, kv_lora_rank: 16, qk_nope_head_dim: 12, qk_rope_head_dim: 8, v_head_dim: 16}"
sed -i "s/max_seq_len: 64}/max_seq_len: 64, $MLA}/" $TMP/llama.yaml
sed -e "s/q_lora_rank: 24/q_lora_rank: 0/" $TMP/llama.yaml >$TMP/noq.yaml
EQ="python3 test/tools/equiv.py --steps 6"

$EQ --name _mla --config $TMP/llama.yaml --layout "dp=2 zero=3" --layout "tp=2" \
    --layout "tp=2 sp=true" --layout "pp=2 sched=1f1b" --layout "cp=2" \
    --layout "cp=2 parallel.cp_layout=contiguous model.mla.cp_latent=false" \
    --layout "tp=2 sp=true dp=2 zero=3"
$EQ --name _mla_noq --config $TMP/noq.yaml --layout "tp=2 sp=true" --layout "cp=2 parallel.cp_comm=allgather"

# the latent ring (model.mla.cp_latent, on by default): cp ring and allgather pass [RMSNorm(c_kv),
# k_rope] and re-expand; its gradient comes home contracted (docs/deepseek.md). Document masks
# (blocks skipped), tp2+sp (partial latent gradients of each rank's heads), cp 4 (gradients
# passed on over several hops), the q latent on and off
$EQ --name _mla_latent --config $TMP/llama.yaml --set data.doc_mask=true --layout "cp=2" \
    --layout "cp=2 parallel.cp_comm=allgather parallel.cp_layout=contiguous" \
    --layout "tp=2 sp=true cp=2" --layout "cp=4 parallel.cp_layout=contiguous"
$EQ --name _mla_latent_noq --config $TMP/noq.yaml --layout "cp=2 parallel.cp_layout=contiguous" \
    --layout "tp=2 sp=true cp=2" --layout "cp=4"
# its bytes by hand (B 1, T 32, 2 layers, 4 micro-batches a step, fp32): a block's latent is
# Tl x (kv_lora_rank 16 + qk_rope_head_dim 8) x 4 bytes, its K/V 2 x Tl x 4 heads x (12 + 8) x 4.
# cp 2 zigzag (Tl 16: latent 1536, K/V 10240): a rank sends its latent forward, again in
# backward, and the other rank's gradient home (nothing on the first hop): 3 x 1536 a rank and
# layer, over the group x 2 ranks x 2 layers x 4 = 73728; K/V: forward 1, backward 1 + the
# gradients' 2 hops, 4 x 10240 x 2 x 2 x 4 = 655360. cp 4 contiguous (Tl 8: latent 768): block g
# hops 3 - g (causal), forward 6 + backward 6 + gradients 6 (hops - 1 on, 1 home) = 18 x 768 x 2 x 4
# = 110592
latent_bytes() { # NAME CP LAYOUT CP_LATENT EXPECTED
    scripts/ustrun --nproc-per-node $2 $UST train $TMP/llama.yaml --set parallel.cp=$2 \
        --set parallel.cp_layout=$3 --set model.mla.cp_latent=$4 --set train.steps=1 \
        --set checkpoint.resume=none --set checkpoint.every=0 \
        --set logging.metrics_file=$TMP/$1.jsonl >$TMP/$1.out 2>&1 || { fail $1 "$(tail -2 $TMP/$1.out)"; return; }
    got=$(grep -o '"comm_bytes_cp_group":[0-9]*' $TMP/$1.jsonl | head -1 | cut -d: -f2)
    [ "$got" = "$5" ] && pass $1 || fail $1 "comm_bytes_cp_group $got, by hand $5"
}
latent_bytes mla_latent_ring_cp2_bytes_equal_hand_count 2 zigzag true 73728
latent_bytes mla_kv_ring_cp2_bytes_equal_hand_count 2 zigzag false 655360
latent_bytes mla_latent_ring_cp4_contiguous_bytes_equal_hand_count 4 contiguous true 110592
plan_matches_arena mla_latent_plan_equals_arena_cp2 $TMP/llama.yaml 2 --set parallel.cp=2 \
    --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=0

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
