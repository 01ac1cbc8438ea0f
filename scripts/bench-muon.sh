#!/usr/bin/env bash
# Muon against AdamW in `make bench`: GPT-2 124M (B=4, T=64 per rank, fp32, one thread per rank)
# on one rank and at dp=2 ZeRO-1, each optimizer the same run otherwise. Prints the step time,
# the per-rank optimizer bytes and the dp bytes sent per step, Muon over AdamW, and the Newton-
# Schulz time per step (Muon's step less AdamW's), from which the tokens per step at which Muon
# comes within the 1.15x target follow (the forward and backward grow with the tokens, the
# orthogonalisation does not). Under ZeRO-1 each rank orthogonalises about half the matrices.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-2}
run() { # run NAME DP ZERO OPTIMIZER
    bench_run "$1" "$2" configs/bench-gpt2-124m.yaml --set parallel.dp=$2 --set optimizer.zero_stage=$3 \
        --set optimizer.name=$4 --set train.global_batch_size=$((4 * $2)) --set train.steps=$((STEPS + 1))
}
for o in adamw muon; do run dp1_$o 1 0 $o; run dp2_$o 2 1 $o; done
python3 - "$TMP" "$STEPS" <<'PY'
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    timed = rows[1:]  # one warm-up step
    r = rows[-1]
    return sum(x["step_ms"] for x in timed) / len(timed), r["mem_optim"], r["comm_bytes_dp"], r["peak_mem_bytes"]
print(f"bench muon: GPT-2 124M, B=4 T=64 per rank (256 tokens), 1 thread per rank, {steps} timed steps")
for dp in (1, 2):
    a, m = load(f"dp{dp}_adamw"), load(f"dp{dp}_muon")
    ns = m[0] - a[0]
    # at T tokens per rank the step is about a*T/256 + ns: within 1.15x once ns <= 0.15 a T/256
    tokens = 256 * ns / (0.15 * a[0]) if ns > 0 else 0
    comm = f", dp bytes {m[2] / max(a[2], 1):.2f}x ({a[2] / 2**20:.0f} -> {m[2] / 2**20:.0f} MiB)" if dp > 1 else ""
    print(f"  dp={dp}{' ZeRO-1' if dp > 1 else '       '}: step {a[0]:7.0f} -> {m[0]:7.0f} ms ({m[0] / a[0]:.2f}x), "
          f"optimizer {a[1] / 2**20:6.1f} -> {m[1] / 2**20:6.1f} MiB, arena {m[3] / a[3]:.2f}x{comm}; "
          f"Newton-Schulz {ns:.0f} ms/step: within 1.15x from ~{tokens:,.0f} tokens per rank and step")
PY
