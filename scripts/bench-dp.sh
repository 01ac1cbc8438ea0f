#!/usr/bin/env bash
# The data-parallel benchmark of `make bench`: GPT-2 124M (B=4 per rank, T=64, fp32, one thread
# per rank) at dp=1 and at dp=2 under each ZeRO stage, started with scripts/ustrun. Prints the
# step time relative to dp=1 (same per-rank batch) and each stage's per-rank parameter +
# gradient + optimizer bytes relative to stage 0, measured by the ranks' own arenas.
# Targets (issue 4): stages 1-3 within 15% of stage 0's step time; stage 3 <= 55% of stage 0's
# parameter+gradient+optimizer memory.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-4}
run() { # run NAME DP ZERO
    bench_run "$1" "$2" configs/bench-gpt2-124m.yaml --set parallel.dp=$2 --set optimizer.zero_stage=$3 \
        --set train.global_batch_size=$((4 * $2)) --set train.steps=$((STEPS + 2))
}
run dp1 1 0
for z in 0 1 2 3; do run z$z 2 $z; done
python3 - "$TMP" "$STEPS" <<'PY'
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    timed = rows[2:]  # two warm-up steps
    ms = sum(r["step_ms"] for r in timed) / len(timed)
    r = rows[-1]
    return ms, r["mem_params"] + r["mem_grads"] + r["mem_optim"], r["peak_mem_bytes"]
base_ms, base_mem, _ = load("dp1")
z0_ms, z0_mem, _ = load("z0")
print(f"bench dp: GPT-2 124M, B=4 T=64 per rank, 1 thread per rank, {steps} timed steps")
print(f"  dp=1          {base_ms:8.0f} ms/step   params+grads+optim {base_mem / 2**20:8.1f} MiB")
for z in range(4):
    ms, mem, peak = load(f"z{z}")
    print(f"  dp=2 zero={z}   {ms:8.0f} ms/step ({ms / base_ms:4.2f}x dp=1, {ms / z0_ms:4.2f}x zero=0)"
          f"   params+grads+optim {mem / 2**20:8.1f} MiB ({mem / z0_mem:4.2f}x zero=0)"
          f"   arena {peak / 2**20:8.1f} MiB")
PY
