#!/usr/bin/env bash
# The sliding-window benchmark of `make bench`, one run: the attention op alone at T=4096 with a
# window of 512 keys (1/8 of T) against causal attention (forward + backward, one thread), then
# the context-parallel benchmark's llama (configs/bench-cp-llama.yaml, T=4096) at cp=4 on the
# ring with full and windowed attention, zigzag and contiguous: step time and the bytes the cp
# group sent per step (comm_bytes_cp_group, every rank's summed). The ring sends a block only as
# far as the last rank whose windows reach it (docs/cp.md).
. "$(dirname "$0")/bench-lib.sh"
W=512
$UST bench attention --seq-len 4096 --window $W --iters 2 --threads 1
RUNS="zigzag:0 contiguous:0 zigzag:$W contiguous:$W"
for r in $RUNS; do
    layout=${r%%:*} w=${r#*:}
    win=()
    [ "$w" != 0 ] && win=(--set model.sliding_window=$w)
    bench_run "$layout-$w" 4 configs/bench-cp-llama.yaml --set parallel.cp=4 \
        --set parallel.cp_comm=ring --set parallel.cp_layout=$layout --set train.steps=3 "${win[@]}"
done
python3 - "$TMP" $RUNS <<'PY'
import json, sys
tmp = sys.argv[1]
print("bench window: llama 2x256, 4 heads, T=4096, B=1, cp=4 ring, 1 thread per rank (steps after the first)")
base = None
for run in sys.argv[2:]:
    layout, w = run.split(":")
    rows = [json.loads(l) for l in open(f"{tmp}/{layout}-{w}.jsonl")][1:]
    ms = sum(r["step_ms"] for r in rows) / len(rows)
    sent = rows[-1]["comm_bytes_cp_group"]
    base = base or sent
    name = f"{'window ' + w if w != '0' else 'full'} {layout}"
    print(f"  {name:<22} {ms:8.0f} ms/step  cp group sent {sent / 2**20:8.1f} MiB/step"
          f" ({sent / base:4.2f}x full zigzag)")
PY
