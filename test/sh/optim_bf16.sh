#!/usr/bin/env bash
# optimizer.state_dtype: bf16: AdamW's moments and Muon's momentum are stored in bf16 (the
# checkpoint's fp32 values are bf16 numbers: low 16 bits zero) while the master weights stay fp32;
# the run trains within 1e-3 of the fp32-state run; the optimizer memory drops by half the states
# (the metrics' mem_optim, and the plan equals the arena); ZeRO and tp layouts train the
# single-process bf16-state model (rounding is per element, so sharding does not change it);
# a resume continues bit for bit.
. "$(dirname "$0")/../lib.sh"

need_py optim_bf16 numpy || exit 0
equiv_configs bf16-states 4 2
R=$TMP/r
for o in adamw muon; do
    for s in fp32 bf16; do
        $UST train $TMP/llama.yaml --set optimizer.name=$o --set optimizer.state_dtype=$s --set train.steps=12 \
            --set checkpoint.dir=$R/ck_${o}_$s --set checkpoint.every=12 \
            --set logging.metrics_file=$R/${o}_$s.jsonl >$R.out 2>&1 || fail optim_bf16_$o "run: $(tail -2 $R.out)"
    done
    python3 - $R $o <<'PY' && pass optim_bf16_${o}_states_are_bf16_and_train_like_fp32 || fail optim_bf16_${o}_states_are_bf16_and_train_like_fp32 "see above"
import json, struct, sys
import numpy as np
R, o = sys.argv[1:3]
def state(s):
    f = open(f"{R}/ck_{o}_{s}/step_12/optimizer.safetensors", "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    f.read(n)
    return np.frombuffer(f.read(), dtype=np.uint32)
def last(s):
    return json.loads(open(f"{R}/{o}_{s}.jsonl").readlines()[-1])
low16, low32 = np.count_nonzero(state("bf16") & 0xFFFF), np.count_nonzero(state("fp32") & 0xFFFF)
a, b = last("fp32"), last("bf16")
saved = a["mem_optim"] - b["mem_optim"]
want = a["mem_params"]  # half of both states (params whole: as many floats)
print(f"{o}: bf16 states with low bits set {low16} (fp32: {low32}); loss {b['loss']:.6f} vs {a['loss']:.6f}; "
      f"optimizer bytes {b['mem_optim']} vs {a['mem_optim']} (saved {saved}, formula {want})")
sys.exit(0 if low16 == 0 and low32 > 0 and abs(a["loss"] - b["loss"]) < 1e-3 and saved == want else 1)
PY
done

plan_matches_arena optim_bf16_plan_equals_arena_zero1 $TMP/llama.yaml 2 --set parallel.dp=2 \
    --set optimizer.zero_stage=1 --set optimizer.state_dtype=bf16 --set optimizer.name=muon \
    --set train.steps=2 --set checkpoint.every=0 --set checkpoint.resume=none

# plan's first step counts the bf16 slots: 4 + 4 + 2 x 2 bytes per parameter (16 in fp32)
p16=$($UST plan $TMP/llama.yaml --world 2 2>&1 | grep -o 'optimizer state take [0-9]* bytes')
p12=$($UST plan $TMP/llama.yaml --world 2 --set optimizer.state_dtype=bf16 2>&1 | grep -o 'optimizer state take [0-9]* bytes')
[ "$p16" = "optimizer state take 16 bytes" ] && [ "$p12" = "optimizer state take 12 bytes" ] &&
    pass optim_bf16_plan_counts_12_bytes || fail optim_bf16_plan_counts_12_bytes "'$p16' / '$p12'"

EQ="python3 test/tools/equiv.py --steps 4"
$EQ --name _bf16_states --config $TMP/llama.yaml --set optimizer.state_dtype=bf16 \
    --layout "dp=2 zero=1" --layout "dp=2 zero=3"
$EQ --name _bf16_states_muon --config $TMP/llama.yaml --set optimizer.state_dtype=bf16 --set optimizer.name=muon \
    --layout "dp=2 tp=2 zero=2"
$EQ --name _bf16_states_muon --config $TMP/llama.yaml --set optimizer.state_dtype=bf16 --set optimizer.name=muon \
    --save-layout "dp=2 zero=3" --resume-at 2 --layout "dp=1"

# a resume on the same layout continues bit for bit (the states round-trip through fp32 exactly)
S=$TMP/s
$UST train $TMP/llama.yaml --set optimizer.state_dtype=bf16 --set optimizer.name=muon --set train.steps=4 \
    --set checkpoint.dir=$S/a --set checkpoint.resume=none --set logging.metrics_file=$S/a.jsonl >/dev/null 2>&1
$UST train $TMP/llama.yaml --set optimizer.state_dtype=bf16 --set optimizer.name=muon --set train.steps=4 \
    --set train.stop_at_step=2 --set checkpoint.dir=$S/b --set logging.metrics_file=$S/b.jsonl >/dev/null 2>&1
$UST train $TMP/llama.yaml --set optimizer.state_dtype=bf16 --set optimizer.name=muon --set train.steps=4 \
    --set checkpoint.dir=$S/b --set logging.metrics_file=$S/b.jsonl >/dev/null 2>&1
a=$(grep -o '"loss":[^,]*' $S/a.jsonl | tail -2)
b=$(grep -o '"loss":[^,]*' $S/b.jsonl | tail -2)
[ -n "$a" ] && [ "$a" = "$b" ] && pass optim_bf16_resume_bit_for_bit || fail optim_bf16_resume_bit_for_bit "$a vs $b"
exit 0
