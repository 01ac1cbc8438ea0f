#!/usr/bin/env bash
# Muon on one process against a numpy reference written from the math (test/tools/muon_ref.py):
# the reference's own Newton-Schulz (the quintic's polynomial, orthogonality within the published
# band), then one step of tiny models (llama; gpt2 with biases and tied embeddings, the original
# scale rule, plain momentum and AdamW groups at their own lr; a MoE llama whose experts are
# orthogonalised one by one, routers on AdamW or, with muon_routers, Muon): every tensor equals
# the reference to 1e-6. A run resumed from a Muon checkpoint continues bit for bit; bad keys exit 2
# naming the key.
. "$(dirname "$0")/../lib.sh"

need_py muon numpy || exit 0
equiv_configs muon 4 2
REF="python3 test/tools/muon_ref.py"
python3 test/tools/muon_ref.py selftest >$TMP/self.out && pass muon_reference_newton_schulz_is_the_polynomial ||
    fail muon_reference_newton_schulz_is_the_polynomial "$(tail -3 $TMP/self.out)"

# one_step NAME CONFIG REF_ARGS -- SETS...: two steps with a checkpoint after each, then the
# reference's step 2 from step 1's checkpoint
one_step() {
    local name=$1 cfg=$2 refargs=$3 d=$TMP/$1
    shift 4
    $UST train $cfg --set optimizer.name=muon --set train.steps=2 --set checkpoint.dir=$d/ck \
        --set checkpoint.every=1 --set checkpoint.keep_last=5 --set checkpoint.resume=none \
        --set logging.metrics_file=$d/m.jsonl "$@" >$d.out 2>&1 || { fail $name "run: $(tail -2 $d.out)"; return; }
    $REF step $d/ck/step_1 $d/ck/step_2 $d/m.jsonl $refargs >$d.ref 2>&1 && pass $name ||
        fail $name "$(tail -2 $d.ref)"
}
one_step muon_step_llama_matches_numpy $TMP/llama.yaml "" --
one_step muon_step_gpt2_original_scale_plain_momentum_adamw_lr_matches_numpy $TMP/gpt2.yaml \
    "--scale original --no-nesterov --mu 0.9 --lr-ratio 0.15" -- \
    --set optimizer.muon_scale=original --set optimizer.nesterov=false --set optimizer.momentum=0.9 \
    --set optimizer.lr=0.02 --set optimizer.adamw_lr=0.003
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 1}}/' \
    $TMP/llama.yaml >$TMP/moe.yaml
one_step muon_step_moe_per_expert_matches_numpy $TMP/moe.yaml "" --
one_step muon_step_moe_routers_on_muon_matches_numpy $TMP/moe.yaml "--routers --ns-steps 3" -- \
    --set optimizer.muon_routers=true --set optimizer.ns_steps=3

# momentum is checkpointed: 4 steps straight equal 2 steps, then a resume for 2 more, bit for bit
R=$TMP/resume
$UST train $TMP/llama.yaml --set optimizer.name=muon --set train.steps=4 --set checkpoint.dir=$R/a \
    --set checkpoint.resume=none --set logging.metrics_file=$R/a.jsonl >/dev/null 2>&1
$UST train $TMP/llama.yaml --set optimizer.name=muon --set train.steps=4 --set train.stop_at_step=2 \
    --set checkpoint.dir=$R/b --set logging.metrics_file=$R/b.jsonl >/dev/null 2>&1
$UST train $TMP/llama.yaml --set optimizer.name=muon --set train.steps=4 --set checkpoint.dir=$R/b \
    --set checkpoint.resume=auto --set logging.metrics_file=$R/b.jsonl >/dev/null 2>&1
a=$(grep -o '"loss":[^,]*' $R/a.jsonl | tail -2)
b=$(grep -o '"loss":[^,]*' $R/b.jsonl | tail -2)
[ -n "$a" ] && [ "$a" = "$b" ] && [ $(wc -l <$R/b.jsonl) = 4 ] && pass muon_resume_continues_bit_for_bit ||
    fail muon_resume_continues_bit_for_bit "straight: $a; resumed: $b"

# switching optimizer on resume: refused naming both, unless optimizer.reset_state: then AdamW's
# weights carry over and Muon's momentum starts from zero (the reference's step from them)
S=$TMP/switch
$UST train $TMP/llama.yaml --set train.steps=4 --set train.stop_at_step=2 --set checkpoint.dir=$S/ck \
    --set checkpoint.keep_last=5 --set logging.metrics_file=$S/m.jsonl >/dev/null 2>&1
expect_exit muon_resume_from_adamw_needs_reset_state 2 "optimizer.name: adamw.*optimizer.name: muon.*reset_state" -- \
    $UST train $TMP/llama.yaml --set optimizer.name=muon --set train.steps=4 --set checkpoint.dir=$S/ck
$UST train $TMP/llama.yaml --set optimizer.name=muon --set optimizer.reset_state=true --set train.steps=4 \
    --set train.stop_at_step=3 --set checkpoint.dir=$S/ck --set checkpoint.every=1 --set checkpoint.keep_last=5 \
    --set logging.metrics_file=$S/m.jsonl >$S.out 2>&1 && grep -q "optimizer state from zero" $S.out &&
    $REF step $S/ck/step_2 $S/ck/step_3 $S/m.jsonl --fresh >$S.ref 2>&1 && pass muon_reset_state_keeps_adamw_weights_zero_momentum ||
    fail muon_reset_state_keeps_adamw_weights_zero_momentum "$(tail -2 $S.out) $(tail -2 $S.ref)"

# training quality on the bundled demo data (configs/tiny.yaml, fixed seed, deterministic): Muon
# at the same lr (the moonlight scale matches AdamW's update RMS) is not worse than AdamW at any
# validation point of 60 steps; the line printed gives the steps each needs to AdamW's final
# validation loss
Q=$TMP/quality
$UST data demo $Q/data >/dev/null
for o in adamw muon; do
    $UST train configs/tiny.yaml --set optimizer.name=$o --set "data.train=$Q/data/train_*.bin" \
        --set "data.val=$Q/data/val_*.bin" --set checkpoint.dir=$Q/ck_$o --set checkpoint.resume=none \
        --set checkpoint.every=0 --set train.steps=60 --set data.val_every=10 \
        --set logging.metrics_file=$Q/$o.jsonl >$Q.out 2>&1 || fail muon_quality "run: $(tail -2 $Q.out)"
done
python3 - $Q/adamw.jsonl $Q/muon.jsonl <<'PY' && pass muon_not_worse_than_adamw_at_equal_steps || fail muon_not_worse_than_adamw_at_equal_steps "see above"
import json, sys
val = [{r["step"]: r["val_loss"] for r in map(json.loads, open(p)) if "val_loss" in r} for p in sys.argv[1:3]]
a, m = val
target = a[max(a)]
reach = [min((s for s in v if v[s] <= target), default=None) for v in val]
print("val loss by step:", " ".join(f"{s}: {a[s]:.4f}/{m[s]:.4f}" for s in sorted(a)), "(AdamW/Muon)")
print(f"steps to AdamW's final val loss {target:.4f}: AdamW {reach[0]}, Muon {reach[1]}")
sys.exit(0 if sorted(a) == sorted(m) and len(a) >= 5 and all(m[s] <= a[s] for s in a) else 1)
PY

for bad in "optimizer.ns_steps=0:optimizer.ns_steps" "optimizer.ns_steps=21:optimizer.ns_steps" \
    "optimizer.muon_scale=rms:optimizer.muon_scale" "optimizer.momentum=1:optimizer.momentum" \
    "optimizer.adamw_lr=-1:optimizer.adamw_lr" "optimizer.name=sgd:optimizer.name"; do
    expect_exit "muon_bad_${bad%%:*}" 2 "${bad#*:}" -- $UST train $TMP/llama.yaml \
        --set optimizer.name=muon --set "${bad%%:*}" --set checkpoint.resume=none
done
exit 0
