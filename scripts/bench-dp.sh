#!/usr/bin/env bash
# The data-parallel benchmark of `make bench`: GPT-2 124M (B=4 per rank, T=64, fp32, one thread
# per rank) at dp=1, at dp=2 under each ZeRO stage and at dp=4 under stages 0 and 3, started
# with scripts/ustrun. Prints the step time relative to dp=1 (same per-rank batch) and to stage 0
# at the same dp, and each stage's per-rank parameter + gradient + optimizer bytes relative to
# stage 0, measured by the ranks' own arenas (the memory plan's figures, byte for byte).
# Targets (issues 4 and 22): stages 1-3 within 15% of stage 0's step time; stage 3 <= 0.55x of
# stage 0's parameter+gradient+optimizer memory at dp=2 and <= 0.35x at dp=4 (ZeRO-3 holds the
# vocabulary tables in row chunks, never whole). DP4=0 skips the dp=4 runs. On a machine with
# fewer cores than ranks the step times measure time-sharing, not the communication.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-4}
DP4=${DP4:-1}
run() { # run NAME DP ZERO
    bench_run "$1" "$2" configs/bench-gpt2-124m.yaml --set parallel.dp=$2 --set optimizer.zero_stage=$3 \
        --set train.global_batch_size=$((4 * $2)) --set train.steps=$((STEPS + 2))
}
run dp1 1 0
for z in 0 1 2 3; do run z$z 2 $z; done
if [ "$DP4" = 1 ]; then for z in 0 3; do run dp4z$z 4 $z; done; fi
python3 - "$TMP" "$STEPS" "$DP4" <<'PY'
import json, sys
tmp, steps, dp4 = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def load(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    timed = rows[2:]  # two warm-up steps
    ms = sum(r["step_ms"] for r in timed) / len(timed)
    r = rows[-1]
    return ms, r["mem_params"] + r["mem_grads"] + r["mem_optim"], r["peak_mem_bytes"]
base_ms, base_mem, _ = load("dp1")
print(f"bench dp: GPT-2 124M, B=4 T=64 per rank, 1 thread per rank, {steps} timed steps")
print(f"  dp=1          {base_ms:8.0f} ms/step   params+grads+optim {base_mem / 2**20:8.1f} MiB")
runs = [(2, z, f"z{z}") for z in range(4)] + ([(4, z, f"dp4z{z}") for z in (0, 3)] if dp4 else [])
z0 = {}
for n, z, name in runs:
    ms, mem, peak = load(name)
    if z == 0:
        z0[n] = (ms, mem)
    target = {2: 0.55, 4: 0.35}[n] if z == 3 else None
    ok = "" if target is None else f"  (target <= {target:.2f}x: {'met' if mem / z0[n][1] <= target else 'MISSED'})"
    print(f"  dp={n} zero={z}   {ms:8.0f} ms/step ({ms / base_ms:4.2f}x dp=1, {ms / z0[n][0]:4.2f}x zero=0)"
          f"   params+grads+optim {mem / 2**20:8.1f} MiB ({mem / z0[n][1]:4.2f}x zero=0)"
          f"   arena {peak / 2**20:8.1f} MiB{ok}")
PY
