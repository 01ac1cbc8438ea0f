#!/usr/bin/env bash
# The MoE benchmark of `make bench` (scripts/bench-moe.sh [all|ep|grouped], default all).
# ep: a small llama with 8 experts (top-2) in every layer at dp=4 and ep = 1, 2, 4 (4 ranks, one
#   thread each, oversubscribed on a small machine). Prints the per-rank parameter memory and its
#   expert part (target: 1/ep of the ep=1 expert bytes; the expert part is measured as what ep=2
#   saves over ep=1, doubled) and the share of step time in the dispatch/combine all-to-alls.
# grouped: one process (2 threads), a llama whose 2 layers are MoE with 8, 16 and 64 experts
#   (top-2, d_ff_expert 128), each trained with the local experts' projections as one grouped
#   GEMM (model.moe.grouped_gemm: true) and as one linear per expert (false), in the same run;
#   prints the fastest step of each (steps 3-12: the minimum, robust to other jobs on a shared
#   machine) and the speedup.
. "$(dirname "$0")/bench-lib.sh"
what=${1:-all}
if [ "$what" = all ] || [ "$what" = ep ]; then
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
fi
if [ "$what" = all ] || [ "$what" = grouped ]; then
    for E in 8 16 64; do
        for g in true false; do
            bench_run grouped$E$g 1 configs/bench-moe-llama.yaml --set parallel.dp=1 \
                --set train.threads=${BENCH_THREADS:-2} --set model.n_layer=2 --set model.moe.num_experts=$E \
                --set model.moe.d_ff_expert=128 --set train.global_batch_size=2 \
                --set train.steps=12 --set model.moe.grouped_gemm=$g
        done
    done
    python3 - "$TMP" "${BENCH_THREADS:-2}" <<'PY'
import json, sys
tmp = sys.argv[1]
print("bench moe grouped GEMM: llama 2 x 256, every layer MoE, top-2, d_ff_expert 128, T=256, B=2,"
      f" one process, {sys.argv[2]} threads (fastest of steps 3-12)")
def ms(name):
    r = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")][2:]
    return min(x["step_ms"] for x in r)
for E in (8, 16, 64):
    g, p = ms(f"grouped{E}true"), ms(f"grouped{E}false")
    print(f"  E={E:3d} ({1024 // E:4d} rows/expert on average): per-expert {p:7.1f} ms/step,"
          f" grouped {g:7.1f} ms/step, speedup {p / g:4.2f}x")
PY
fi
