#!/usr/bin/env bash
# Muon in the equivalence harness: every layout trains the single-process Muon model (per-step
# losses and final weights): ZeRO-0..3 over dp 2-4 (each matrix orthogonalised by one owner and
# returned through a reduce-scatter), tp with and without sp (split matrices gathered over tp),
# pp with 1f1b, zb, dualpipev and dualpipe (the mirror's copies step on the summed gradient), ep
# (experts orthogonalised where they live), cp, all five at once, and a tied gpt2 under ZeRO-3's
# vocabulary chunks and pp's tied copy (on AdamW); momentum checkpoints resume across layouts.
# A rank's dropped gradients are caught; the memory plan equals the arena; the extra dp traffic
# equals its formula.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-muon 4 2
sed -i -e 's/n_layer: 2/n_layer: 4/' -e 's/global_batch_size: 4/global_batch_size: 8/' \
    -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2}}/' \
    -e 's/^optimizer: {/optimizer: {name: muon, eps: 1.0e-6, /' $TMP/llama.yaml
# AdamW eps 1e-6 for the AdamW groups: see test/sh/equiv_moe.sh (near-tied routing choices)
sed -i -e 's/^optimizer: {/optimizer: {name: muon, /' -e 's/global_batch_size: 4/global_batch_size: 6/' $TMP/gpt2.yaml
EQ="python3 test/tools/equiv.py --steps 4"

$EQ --name _muon --config $TMP/llama.yaml \
    --layout "dp=2 zero=0" --layout "dp=2 zero=1" --layout "dp=4 zero=2" --layout "dp=4 zero=3" \
    --layout "tp=2" --layout "dp=2 tp=2 sp=true zero=1" --layout "pp=2" \
    --layout "pp=2 vpp=2 sched=dualpipev" --layout "pp=2 vpp=2 sched=dualpipe" \
    --layout "dp=2 ep=2" --layout "dp=4 ep=2 zero=3" --layout "cp=2" --layout "dp=2 cp=2 zero=2" \
    --layout "dp=2 tp=2 pp=2 cp=2 ep=2 sp=true zero=1"
$EQ --name _muon_gpt2_tied --config $TMP/gpt2.yaml \
    --layout "dp=3 zero=3 parallel.zero3_vocab_chunk_rows=100" --layout "dp=2 pp=2 sched=zb zero=1"
$EQ --name _muon_fault --config $TMP/llama.yaml --expect-fail --env UST_FAULT_DP_DROP_GRADS_RANK=1 \
    --layout "dp=2 zero=1" --layout "dp=2 zero=3"
# the momentum is saved whole and re-sharded: ZeRO-3 x tp -> ZeRO-1 x ep, and one process
$EQ --name _muon_resume --config $TMP/llama.yaml --save-layout "dp=2 tp=2 zero=3" --resume-at 2 \
    --layout "dp=2 ep=2 zero=1" --layout "dp=1"

# the memory plan counts Muon's work areas (the tp gathers' whole-matrix buffers too): plan = arena
for z in 0 3; do
    plan_matches_arena muon_plan_equals_arena_dp2_tp2_zero$z $TMP/llama.yaml 4 --set parallel.dp=2 \
        --set parallel.tp=2 --set optimizer.zero_stage=$z --set train.steps=2 --set checkpoint.every=0 \
        --set checkpoint.resume=none
done

# the traffic Muon adds under ZeRO-1/2/3, from the metrics' comm_bytes_dp of the same layout with
# AdamW: each unit holding Muon matrices (here the layers) is all-gathered and reduce-scattered
# once more, 2(n-1)/n of its padded length (dense llama, 3 layers; the units as in
# test/sh/dp_comm_volume.sh)
cat >$TMP/dense.yaml <<EOT
run:   {name: volume, seed: 7}
model: {arch: llama, n_layer: 3, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 500, max_seq_len: 64}
train: {steps: 2, seq_len: 32, micro_batch_size: 2, global_batch_size: 8}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {every: 0, resume: none}
EOT
for z in 1 2 3; do for o in adamw muon; do
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/dense.yaml --set parallel.dp=2 --set optimizer.zero_stage=$z \
        --set optimizer.name=$o --set logging.metrics_file=$TMP/v_${z}_$o.jsonl >$TMP/v.out 2>&1 ||
        fail muon_extra_traffic_zero$z "run failed: $(tail -2 $TMP/v.out)"
done
python3 - $TMP/v_${z}_adamw.jsonl $TMP/v_${z}_muon.jsonl <<'PY' && pass muon_extra_traffic_zero$z || fail muon_extra_traffic_zero$z "see above"
import json, sys
a, m = (json.loads(open(p).readlines()[-1])["comm_bytes_dp"] for p in sys.argv[1:3])
n, L, C, H, KV, F = 2, 3, 64, 4, 2, 96
D = C // H
r16 = lambda x: (x + 15) // 16 * 16
pad = lambda x: (x + 16 * n - 1) // (16 * n) * (16 * n)
layer = pad(sum(r16(x) for x in [C, D * H * C, D * KV * C, D * KV * C, C * H * D, C, F * C, F * C, C * F]))
want = 2 * (n - 1) / n * L * layer * 4
print(f"AdamW {a} bytes, Muon {m} bytes: +{m - a} ({m / a:.2f}x), formula +{want:.0f}")
sys.exit(0 if m - a == want else 1)
PY
done
exit 0
