#!/usr/bin/env bash
# The MoE benchmark of `make bench`: a small llama with 8 experts (top-2) in every layer at dp=4
# and ep = 1, 2, 4 (4 ranks, one thread each, oversubscribed on a small machine). Prints the
# per-rank parameter memory and its expert part (target: 1/ep of the ep=1 expert bytes; the
# expert part is measured as what ep=2 saves over ep=1, doubled) and the share of step time in
# the dispatch/combine all-to-alls.
. "$(dirname "$0")/bench-lib.sh"
for ep in 1 2 4; do
    bench_run ep$ep 4 configs/bench-moe-llama.yaml --set parallel.ep=$ep
done
python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
print("bench moe: llama 4 x 256, 8 experts top-2 (d_ff_expert 512), T=256, B=2, dp=4 (steps after the first)")
rows = {ep: [json.loads(l) for l in open(f"{tmp}/ep{ep}.jsonl")][1:] for ep in (1, 2, 4)}
params = {ep: rows[ep][-1]["mem_params"] for ep in rows}
experts1 = 2 * (params[1] - params[2])
dense = params[1] - experts1
for ep in (1, 2, 4):
    r = rows[ep]
    ms = sum(x["step_ms"] for x in r) / len(r)
    a2a = sum(x["ep_comm_ms"] for x in r) / len(r)
    ex = params[ep] - dense
    print(f"  ep={ep}  parameters/rank {params[ep] / 2**20:6.2f} MiB, experts {ex / 2**20:6.2f} MiB"
          f" ({ex / experts1:4.2f}x ep=1, target {1 / ep:4.2f})  {ms:7.1f} ms/step,"
          f" all-to-all {a2a:6.1f} ms ({a2a / ms:5.1%})")
PY
