#!/usr/bin/env bash
# The tracing-overhead benchmark of `make bench` (issue 38): GPT-2 124M (B=4 per rank, T=64,
# fp32, one thread per rank) at 1 rank and at dp=2, each trained ROUNDS times without and with
# logging.trace over its timed steps, the two alternating so that a drift of the machine falls on
# both; prints per layout the traced step time over the untraced one (the median over the
# rounds of each round's ratio, and the spread). Target: under 2% (1.02x). With tracing off a
# run holds a NULL trace pointer: each hook is one pointer test. On a machine busier than the
# ranks' cores the spread says how far to trust the ratio.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-3}
run() { # run NAME DP [--set logging.trace...]
    local name=$1 dp=$2
    shift 2
    bench_run "$name" "$dp" configs/bench-gpt2-124m.yaml --set parallel.dp=$dp \
        --set train.global_batch_size=$((4 * dp)) --set train.steps=$((STEPS + 2)) \
        --set checkpoint.every=0 --set "run.out_dir=$TMP/$name" "$@"
}
for dp in 1 2; do
    for r in $(seq "$ROUNDS"); do
        run "off_dp${dp}_$r" $dp
        run "on_dp${dp}_$r" $dp --set "logging.trace.steps=[3, $((STEPS + 2))]"
    done
done
python3 - "$TMP" "$STEPS" "$ROUNDS" <<'PY'
import json, statistics, sys
tmp, steps, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ms(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    timed = rows[2:]  # two warm-up steps, untraced in both
    return sum(r["step_ms"] for r in timed) / len(timed)
print(f"bench trace: GPT-2 124M, B=4 T=64 per rank, 1 thread per rank, {steps} timed steps, "
      f"{rounds} rounds of untraced then traced")
for dp in (1, 2):
    off = [ms(f"off_dp{dp}_{r}") for r in range(1, rounds + 1)]
    on = [ms(f"on_dp{dp}_{r}") for r in range(1, rounds + 1)]
    ratios = [b / a for a, b in zip(off, on)]
    med = statistics.median(ratios)
    print(f"  dp={dp}: untraced {statistics.median(off):8.0f} ms/step, traced {statistics.median(on):8.0f} "
          f"ms/step: {med:.4f}x (rounds {', '.join('%.4f' % x for x in ratios)}; "
          f"target < 1.02x: {'met' if med < 1.02 else 'MISSED'})")
PY
