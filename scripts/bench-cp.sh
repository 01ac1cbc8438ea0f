#!/usr/bin/env bash
# The context-parallel benchmark of `make bench`: a small llama on 4096-token sequences at
# cp = 1, 2, 4 (zigzag ring, one thread per rank). Prints per-rank activation bytes (target: close
# to 1/cp) and the share of step time spent waiting for key/value blocks.
. "$(dirname "$0")/bench-lib.sh"
for cp in 1 2 4; do
    bench_run cp$cp $cp configs/bench-cp-llama.yaml --set parallel.cp=$cp
done
python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
print("bench cp: llama 2x256, T=4096, B=1, 1 thread per rank (steps after the first)")
base = None
for cp in (1, 2, 4):
    rows = [json.loads(l) for l in open(f"{tmp}/cp{cp}.jsonl")][1:]
    ms = sum(r["step_ms"] for r in rows) / len(rows)
    wait = sum(r["cp_wait_ms"] for r in rows) / len(rows)
    acts = rows[-1]["mem_acts"]
    base = base or acts
    print(f"  cp={cp}  {ms:8.0f} ms/step  waiting for K/V {wait:6.0f} ms ({wait / ms:5.1%})"
          f"  activations {acts / 2**20:7.1f} MiB ({acts / base:4.2f}x cp=1, ideal {1 / cp:4.2f})")
PY
