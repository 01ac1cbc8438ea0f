#!/usr/bin/env bash
# Per-group learning rates (optimizer.embed_lr, optimizer.norm_lr), schedule shapes and weight
# decays (optimizer.embed, optimizer.norm): AdamW's first step moves each
# element by lr x (g / |g| + wd), so against the same run without them the embeddings' and the
# head's step is embed_lr / lr times as large, the norms' and biases' norm_lr / lr, and every other
# tensor's the same bit for bit (llama on AdamW; gpt2 on Muon, whose matrices keep lr and whose
# AdamW groups keep adamw_lr); a group's own warmup scales its first step likewise; a group's weight
# decay moves its step by -lr wd p; every layout trains the one-process model; bad values exit 2.
. "$(dirname "$0")/../lib.sh"

need_py optim_groups numpy safetensors || exit 0
equiv_configs groups 4 2
run() { # run NAME CONFIG STEPS SETS...
    local n=$1 cfg=$2 s=$3
    shift 3
    $UST train $cfg --set train.steps=$s --set checkpoint.dir=$TMP/$n --set checkpoint.resume=none \
        --set checkpoint.every=1 --set logging.metrics_file=$TMP/$n.jsonl "$@" >$TMP/$n.out 2>&1 ||
        echo "run $n failed: $(tail -2 $TMP/$n.out)"
}
# ratios NAME CONFIG EMBED NORM SETS...: one step with and without the groups' rates (lr 3e-3)
ratios() {
    local n=$1 cfg=$2 e=$3 r=$4
    shift 4
    step_ratios $n $cfg $(python3 -c "print($e/3e-3, $r/3e-3)") \
        "--set optimizer.embed_lr=$e --set optimizer.norm_lr=$r" "$@"
}
# step_ratios NAME CONFIG RE RN "B_SETS" SETS...: the first step with B_SETS is RE (RN) times the
# step without them for the embeddings and head (norms and biases), every other tensor's the same
step_ratios() {
    local n=$1 cfg=$2 re=$3 rn=$4 b=$5
    shift 5
    run ${n}_0 $cfg 0 "$@"
    run ${n}_a $cfg 1 "$@"
    run ${n}_b $cfg 1 $b "$@"
    python3 - $TMP/${n}_0/step_0 $TMP/${n}_a/step_1 $TMP/${n}_b/step_1 $re $rn <<'PY' &&
import sys
import numpy as np
from safetensors.numpy import load_file
w0, a, b = (load_file(p + "/model.safetensors") for p in sys.argv[1:4])
re, rn = float(sys.argv[4]), float(sys.argv[5])
bad = []
for k in w0:
    da, db = a[k].astype(np.float64) - w0[k], b[k].astype(np.float64) - w0[k]
    want = re if k.startswith(("model.embed_", "lm_head")) else rn if (k.endswith("bias") or "norm" in k) else None
    if want is None:
        if not np.array_equal(a[k], b[k]):
            bad.append(f"{k} changed")
        continue
    big = np.abs(da) > 1e-3 * np.abs(da).max()  # elements that moved (fp32 differences of weights)
    r = db[big] / da[big]
    if not big.any() or np.abs(r - want).max() > 2e-3 * want:
        bad.append(f"{k}: ratio {r.min() if big.any() else 'none'}..{r.max() if big.any() else ''} want {want}")
print("; ".join(bad[:4]) if bad else "ok")
sys.exit(1 if bad else 0)
PY
        pass $n || fail $n "see above"
}
ratios groups_llama_adamw_embed_and_norm_rates $TMP/llama.yaml 1.5e-3 6e-3
ratios groups_gpt2_muon_embed_and_norm_rates $TMP/gpt2.yaml 6e-3 1.5e-3 --set optimizer.name=muon
ratios groups_llama_bf16_states_embed_and_norm_rates $TMP/llama.yaml 6e-3 1.5e-3 \
    --set optimizer.state_dtype=bf16

# the groups' shapes: optimizer.embed.warmup_steps 0 steps the embeddings at the peak lr at once,
# twice the first warmup rate lr/2 of warmup_steps 2; optimizer.norm.warmup_steps 4 the norms at
# lr/4, half of it (norm.schedule: constant would change no first step: checked in test_train)
step_ratios groups_llama_embed_and_norm_warmups $TMP/llama.yaml 2 0.5 \
    "--set optimizer.embed.warmup_steps=0 --set optimizer.norm.warmup_steps=4"
step_ratios groups_gpt2_muon_embed_and_norm_warmups $TMP/gpt2.yaml 2 0.5 \
    "--set optimizer.embed.warmup_steps=0 --set optimizer.norm.warmup_steps=4" --set optimizer.name=muon

# the groups' weight decays: AdamW's decoupled decay moves p by -lr wd p, so one step with
# optimizer.embed.weight_decay 0 and norm.weight_decay 0.5 differs from the defaults' (0.1 and 0)
# by -lr (wd - wd_default) p0 (lr 1.5e-3: the first of 2 warmup steps), every other tensor the same
run wd_0 $TMP/llama.yaml 0
run wd_a $TMP/llama.yaml 1
run wd_b $TMP/llama.yaml 1 --set optimizer.embed.weight_decay=0 --set optimizer.norm.weight_decay=0.5
python3 - $TMP/wd_0/step_0 $TMP/wd_a/step_1 $TMP/wd_b/step_1 <<'PY' && pass groups_weight_decay_per_group || fail groups_weight_decay_per_group "see above"
import sys
import numpy as np
from safetensors.numpy import load_file
w0, a, b = (load_file(p + "/model.safetensors") for p in sys.argv[1:4])
bad = []
for k in w0:
    norm = k.endswith("bias") or "norm" in k
    dwd = (0 - 0.1) if k.startswith(("model.embed_", "lm_head")) else 0.5 if norm else None
    if dwd is None:
        if not np.array_equal(a[k], b[k]):
            bad.append(f"{k} changed")
        continue
    want = -1.5e-3 * dwd * w0[k].astype(np.float64)
    got = b[k].astype(np.float64) - a[k]
    err = np.abs(got - want).max()
    if not np.abs(want).max() > 0 or err > 2e-2 * np.abs(want).max():
        bad.append(f"{k}: off by {err:.3g} of {np.abs(want).max():.3g}")
print("; ".join(bad[:4]) if bad else "ok")
sys.exit(1 if bad else 0)
PY

sed -i -e 's/^optimizer: {/optimizer: {embed_lr: 1.0e-3, norm_lr: 1.0e-2, embed: {warmup_steps: 0, weight_decay: 0}, norm: {schedule: constant, weight_decay: 0.05}, /' $TMP/llama.yaml
python3 test/tools/equiv.py --steps 3 --name _groups --config $TMP/llama.yaml \
    --layout "dp=2 zero=1" --layout "dp=2 zero=3" --layout "tp=2 pp=2"
python3 test/tools/equiv.py --steps 3 --name _groups_bf16 --config $TMP/llama.yaml \
    --set optimizer.state_dtype=bf16 --layout "dp=2 zero=1"
sed -e 's/embed_lr: 1.0e-3/embed_lr: -1/' $TMP/llama.yaml >$TMP/bad.yaml
expect_exit groups_negative_rate_exits_2 2 "bad.yaml:[0-9]+:[0-9]+: optimizer.embed_lr: -1 .*>= 0" -- \
    $UST validate $TMP/bad.yaml
expect_exit groups_floor_between_minus_one_and_zero_exits_2 2 "optimizer.embed.min_lr \(-0.5\) must be -1" -- \
    $UST validate $TMP/llama.yaml --set optimizer.embed.min_lr=-0.5
expect_exit groups_floor_above_the_peak_exits_2 2 "optimizer.norm.min_lr \(0.5\) must be <= the group's peak lr \(0.01\)" -- \
    $UST validate $TMP/llama.yaml --set optimizer.norm.min_lr=0.5
expect_exit groups_unknown_schedule_exits_2 2 "optimizer.norm.schedule.*same" -- \
    $UST validate $TMP/llama.yaml --set optimizer.norm.schedule=step
