#!/usr/bin/env bash
# The tensor-parallel benchmark of `make bench`: GPT-2 124M (B=4, T=64, fp32, one thread per
# rank) at tp=1, tp=2 and tp=2 with sequence parallelism, started with scripts/ustrun. Prints the
# per-rank activation bytes (target: sequence parallelism cuts the norm/residual part by ~tp)
# and the share of step time spent waiting for tensor-parallel collectives.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-3}
run() { # run NAME TP SP
    bench_run "$1" "$2" configs/bench-gpt2-124m.yaml --set parallel.tp=$2 --set parallel.sp=$3 \
        --set train.steps=$((STEPS + 2))
}
run tp1 1 false
run tp2 2 false
run tp2sp 2 true
python3 - "$TMP" "$STEPS" <<'PY'
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")][2:]
    ms = sum(r["step_ms"] for r in rows) / len(rows)
    comm = sum(r["tp_comm_ms"] for r in rows) / len(rows)
    return ms, comm, rows[-1]["mem_acts"], rows[-1]["mem_params"]
print(f"bench tp: GPT-2 124M, B=4 T=64, 1 thread per rank, {steps} timed steps")
base = load("tp1")
for name, label in (("tp1", "tp=1       "), ("tp2", "tp=2       "), ("tp2sp", "tp=2 sp    ")):
    ms, comm, acts, params = load(name)
    print(f"  {label} {ms:8.0f} ms/step  tp comm {comm:7.0f} ms ({comm / ms:5.1%})"
          f"  activations {acts / 2**20:7.1f} MiB ({acts / base[2]:4.2f}x tp=1)"
          f"  weights {params / 2**20:7.1f} MiB")
PY
