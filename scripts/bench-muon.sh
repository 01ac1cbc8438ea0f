#!/usr/bin/env bash
# Muon against AdamW in `make bench`: GPT-2 124M (fp32, one thread per rank), each optimizer the
# same run otherwise, at two sizes. The small row, B=4 T=64 per rank (256 tokens), on one rank and
# at dp=2 ZeRO-1, where each rank orthogonalises about half the matrices; the realistic row, one
# rank at T=1024, micro-batch 4 and ACCUM micro-batches per step (16384 tokens: what a 124M run
# uses per rank and optimizer step; its warm-up step is one micro-batch, through train.batch_ramp).
# Prints the step time, Muon over AdamW, the per-rank optimizer bytes and the dp bytes sent per
# step, the Newton-Schulz time per step (Muon's step less AdamW's: fixed per step, while the
# forward and backward grow with the tokens) and from it the tokens per rank and step at which
# Muon comes within the 1.15x target. Beside the wall clock, each run's CPU seconds (all its
# steps, warm-up and start-up included) give the same figures on a machine shared with other
# work, where the wall clock mostly measures the neighbours. BIG=0 skips the realistic row.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-2} ACCUM=${ACCUM:-4} BIG=${BIG:-1}
cpu() { awk '{print $16 + $17}' /proc/$$/stat; } # CPU ticks of this shell's finished children
timed() { # timed NAME CMD...: CMD, its children's CPU ticks into $TMP/NAME.cpu
    local t0
    t0=$(cpu)
    "${@:2}"
    echo $(($(cpu) - t0)) >"$TMP/$1.cpu"
}
run() { # run NAME DP ZERO OPTIMIZER
    timed "$1" bench_run "$1" "$2" configs/bench-gpt2-124m.yaml --set parallel.dp=$2 \
        --set optimizer.zero_stage=$3 --set optimizer.name=$4 --set train.global_batch_size=$((4 * $2)) \
        --set train.steps=$((STEPS + 1))
}
big() { # big NAME OPTIMIZER: step 1 one micro-batch (the warm-up), step 2 all ACCUM of them
    local ramp=()
    [ "$ACCUM" -gt 1 ] && ramp=(--set train.batch_ramp.start=4 --set train.batch_ramp.increment=$((4 * ACCUM - 4))
        --set train.batch_ramp.tokens=4096)
    timed "$1" bench_run "$1" 1 configs/bench-gpt2-124m.yaml --set optimizer.name=$2 --set train.seq_len=1024 \
        --set train.global_batch_size=$((4 * ACCUM)) --set train.steps=2 "${ramp[@]}"
}
for o in adamw muon; do run dp1_$o 1 0 $o; run dp2_$o 2 1 $o; done
[ "$BIG" = 0 ] || for o in adamw muon; do big big_$o $o; done
python3 - "$TMP" "$STEPS" "$BIG" "$ACCUM" "$SECONDS" "$(getconf CLK_TCK)" <<'PY'
import json, os, sys
tmp, steps, big, accum, secs, tck = sys.argv[1], int(sys.argv[2]), sys.argv[3] != "0", int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
def load(name):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    timed = rows[1:]  # one warm-up step
    r = rows[-1]
    cpu = int(open(f"{tmp}/{name}.cpu").read()) / tck * 1e3
    return sum(x["step_ms"] for x in timed) / len(timed), r["mem_optim"], r["comm_bytes_dp"], r["peak_mem_bytes"], cpu
def within(a, m, tokens):
    # at T tokens the step is about a*T/tokens + ns (AdamW's update counted with the forward and
    # backward, which errs on the safe side): within 1.15x once ns <= 0.15 a T / tokens
    ns = m - a
    return ns, tokens * ns / (0.15 * a) if ns > 0 else 0
def cpu_row(a, m, n_steps, step_equiv, ranks, tokens):
    # every step orthogonalises once, the warm-up too: Muon's CPU less AdamW's over the run's
    # n_steps is a step's Newton-Schulz time (shared by the ranks); AdamW's CPU over its steps
    # counted in full-size steps (step_equiv) is a step's forward, backward and update
    ns, step = (m - a) / n_steps / ranks, a / step_equiv / ranks
    t = tokens * ns / (0.15 * step) if ns > 0 else 0
    return (f"CPU time per rank: step {step:7.0f} -> {step + ns:7.0f} ms ({(step + ns) / step:.3f}x), "
            f"Newton-Schulz {ns:.0f} ms: within 1.15x from ~{t:,.0f} tokens per rank and step")
print(f"bench muon: GPT-2 124M, fp32, 1 thread per rank, load average {os.getloadavg()[0]:.1f} at the end")
print(f"  B=4 T=64 per rank (256 tokens), {steps} timed steps (wall clock), and CPU time over all {steps + 1} steps:")
for dp in (1, 2):
    a, m = load(f"dp{dp}_adamw"), load(f"dp{dp}_muon")
    ns, tokens = within(a[0], m[0], 256)
    comm = f", dp bytes {m[2] / max(a[2], 1):.2f}x ({a[2] / 2**20:.0f} -> {m[2] / 2**20:.0f} MiB)" if dp > 1 else ""
    print(f"  dp={dp}{' ZeRO-1' if dp > 1 else '       '}: step {a[0]:7.0f} -> {m[0]:7.0f} ms ({m[0] / a[0]:.2f}x), "
          f"optimizer {a[1] / 2**20:6.1f} -> {m[1] / 2**20:6.1f} MiB, arena {m[3] / a[3]:.2f}x{comm}; "
          f"Newton-Schulz {ns:.0f} ms/step: within 1.15x from ~{tokens:,.0f} tokens per rank and step")
    print(f"           {cpu_row(a[4], m[4], steps + 1, steps + 1, dp, 256)}")
if big:
    tokens_big = 4096 * accum
    a, m = load("big_adamw"), load("big_muon")
    ns, tokens = within(a[0], m[0], tokens_big)
    verdict = "meets" if m[0] <= 1.15 * a[0] else f"misses by {m[0] / a[0] - 1.15:.2f}x"
    print(f"  B=4 T=1024 x {accum} micro-batches ({tokens_big} tokens), 1 rank, 1 timed step (wall clock): "
          f"step {a[0]:7.0f} -> {m[0]:7.0f} ms ({m[0] / a[0]:.3f}x: {verdict} the 1.15x target); Newton-Schulz "
          f"{ns:.0f} ms/step, {a[0] / tokens_big:.2f} ms per token forward and backward: within 1.15x from "
          f"~{tokens:,.0f} tokens per rank and step")
    print(f"           {cpu_row(a[4], m[4], 2, 1 + (1 / accum if accum > 1 else 1), 1, tokens_big)}")
print(f"  (the bench took {secs} s)")
PY
