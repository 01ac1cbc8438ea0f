#!/usr/bin/env bash
# The context-parallel benchmark of `make bench`: a small llama on 4096-token sequences (4 heads,
# one thread per rank) at cp = 1, 2, 4 under every cp_comm: the zigzag ring, its all-gather
# variant, Ulysses (a2a: all-to-all to a head split) and, at cp 4, the hierarchical a2a+ring
# (Ulysses over pairs, the ring across). Prints per-rank activation bytes (target: close to
# 1/cp), the share of step time spent waiting in the cp groups and the bytes a rank sent there.
. "$(dirname "$0")/bench-lib.sh"
RUNS="1:ring 2:ring 2:allgather 2:a2a 4:ring 4:allgather 4:a2a 4:a2a+ring"
for r in $RUNS; do
    cp=${r%%:*} mode=${r#*:}
    extra=()
    [ "$mode" = a2a+ring ] && extra=(--set parallel.cp_a2a=2)
    bench_run "cp$cp-$mode" $cp configs/bench-cp-llama.yaml --set parallel.cp=$cp \
        --set parallel.cp_comm=$mode "${extra[@]}"
done
python3 - "$TMP" $RUNS <<'PY'
import json, sys
tmp = sys.argv[1]
print("bench cp: llama 2x256, 4 heads, T=4096, B=1, 1 thread per rank (steps after the first)")
base = None
for run in sys.argv[2:]:
    cp, mode = run.split(":")
    rows = [json.loads(l) for l in open(f"{tmp}/cp{cp}-{mode}.jsonl")][1:]
    ms = sum(r["step_ms"] for r in rows) / len(rows)
    wait = sum(r["cp_wait_ms"] for r in rows) / len(rows)
    sent = rows[-1].get("comm_bytes_cp", 0)
    acts = rows[-1]["mem_acts"]
    base = base or acts
    name = f"cp={cp} {mode if cp != '1' else '-'}"
    print(f"  {name:<14} {ms:8.0f} ms/step  waiting in cp groups {wait:6.0f} ms ({wait / ms:5.1%})"
          f"  sent {sent / 2**20:7.1f} MiB/step  activations {acts / 2**20:7.1f} MiB"
          f" ({acts / base:4.2f}x cp=1, ideal {1 / int(cp):4.2f})")
PY
