#!/usr/bin/env bash
# train.batch_ramp (Megatron's rampup-batch-size): the global batch grows from start by increments
# of whole micro-batches x dp over the first `tokens` tokens consumed (cfg_batch_at). The steps'
# samples_seen and tokens_seen follow the formula exactly; a run stopped inside a ramp stage or
# at a stage boundary and resumed continues the uninterrupted losses bit for bit; every layout
# (dp, ZeRO-3, tp, pp, cp, and four at once) trains the one-process losses, and resumes across
# layouts mid-ramp; sqrt_lr scales the logged rate by sqrt(batch / target); bad ramps exit 2.
. "$(dirname "$0")/../lib.sh"

need_py batch_ramp numpy || exit 0
equiv_configs ramp 4 2
sed -i -e 's/global_batch_size: 4}/global_batch_size: 8, batch_ramp: {start: 2, increment: 2, tokens: 512}}/' \
    $TMP/llama.yaml
run() { # run NAME SETS...: 8 steps, a checkpoint every step, metrics in $TMP/NAME.jsonl
    local n=$1
    shift
    $UST train $TMP/llama.yaml --set train.steps=8 --set checkpoint.dir=$TMP/$n --set checkpoint.every=1 \
        --set checkpoint.keep_last=10 --set logging.metrics_file=$TMP/$n.jsonl "$@" >$TMP/$n.out 2>&1 ||
        echo "run $n failed: $(tail -2 $TMP/$n.out)"
}
run a --set checkpoint.resume=none
python3 - $TMP/a.jsonl <<'PY' && pass ramp_batches_and_tokens_follow_the_formula || fail ramp_batches_and_tokens_follow_the_formula "see above"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
start, inc, ramp, G, T = 2, 2, 512, 8, 32
seen, want = 0, []
for _ in range(8):
    n = (G - start) // inc
    b = min(G, start + (seen * T * n // ramp) * inc)  # floor(tokens x increments / ramp tokens)
    seen += b
    want.append(seen)
got = [r["samples_seen"] for r in rows]
tok = [r["tokens_seen"] for r in rows]
print("samples_seen", got, "want", want)
sys.exit(0 if got == want and tok == [s * T for s in want] and len(set(want[i] - want[i - 1] for i in range(1, 8))) == 4 else 1)
PY

# stopped and resumed: inside a stage (step 4 -> 5, both batch 4) and at a boundary (step 5 -> 6)
losses() { grep -o '"loss":[^,]*' $1 | tail -$2 | tr '\n' ' '; }
for stop in 4 5; do
    run r$stop --set checkpoint.resume=none --set train.stop_at_step=$stop
    run r$stop --set checkpoint.resume=auto
    [ "$(losses $TMP/a.jsonl 8)" = "$(losses $TMP/r$stop.jsonl 8)" ] && pass ramp_resume_after_step_${stop}_is_bit_for_bit ||
        fail ramp_resume_after_step_${stop}_is_bit_for_bit "straight: $(losses $TMP/a.jsonl 4); resumed: $(losses $TMP/r$stop.jsonl 4)"
done

# sqrt_lr: the logged lr is the schedule's times sqrt(the step's batch / 8)
run s --set checkpoint.resume=none --set train.batch_ramp.sqrt_lr=true
python3 - $TMP/a.jsonl $TMP/s.jsonl <<'PY' && pass ramp_sqrt_lr_scales_the_rate || fail ramp_sqrt_lr_scales_the_rate "see above"
import json, math, sys
a, s = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
prev = 0
for x, y in zip(a, s):
    b = x["samples_seen"] - prev
    prev = x["samples_seen"]
    if abs(y["lr"] - x["lr"] * math.sqrt(b / 8)) > 1e-8 * x["lr"]:  # the log's 9 digits
        print("step", x["step"], "lr", y["lr"], "want", x["lr"] * math.sqrt(b / 8)); sys.exit(1)
PY

EQ="python3 test/tools/equiv.py --steps 8"
$EQ --name _ramp --config $TMP/llama.yaml --layout "dp=2" --layout "dp=2 zero=3" --layout "tp=2" \
    --layout "pp=2" --layout "cp=2" --layout "dp=2 tp=2 pp=2 cp=2 sp=true zero=1"
$EQ --name _ramp_resume --config $TMP/llama.yaml --save-layout "dp=2 zero=1" --resume-at 4 \
    --layout "pp=2 tp=2" --layout "dp=1"

# bad ramps: exit 2 naming the key, before anything is built
bad() { # NAME PATTERN SETS...
    local n=$1 p=$2
    shift 2
    expect_exit $n 2 "$p" -- $UST validate $TMP/llama.yaml "$@"
}
bad ramp_start_not_whole_micro_batches_exits_2 "batch_ramp.start \(3\).*multiples.*\(2\)" \
    --set parallel.dp=2 --set train.batch_ramp.start=3 --world 2
bad ramp_start_at_the_target_exits_2 "batch_ramp.start \(8\) must be below.*\(8\)" --set train.batch_ramp.start=8
bad ramp_increments_not_reaching_the_target_exits_2 "8 - 2.*whole increments of 4" \
    --set train.batch_ramp.increment=4
bad ramp_without_tokens_exits_2 "batch_ramp.tokens must be > 0" --set train.batch_ramp.tokens=0
bad ramp_with_moe_exits_2 "batch_ramp with model.moe.num_experts" --set model.moe.num_experts=4
sed -e 's/start: 2/start: -2/' $TMP/llama.yaml >$TMP/neg.yaml
expect_exit ramp_negative_start_exits_2_with_line_col 2 "neg.yaml:[0-9]+:[0-9]+: train.batch_ramp.start: -2" -- \
    $UST validate $TMP/neg.yaml
