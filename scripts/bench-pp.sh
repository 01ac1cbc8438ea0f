#!/usr/bin/env bash
# The pipeline benchmark of `make bench`: a 12-layer llama at pp=4 (ranks oversubscribed on this
# machine, so wall time says little), m = 4, 8, 16 micro-batches per step, every schedule
# (interleaved with vpp=3). Prints the schedule's own accounting beside the analytic bubble
# (p-1)/(v*m): its timeline with the measured mean F/B/W times (free transfers, as on dedicated
# devices) and with unit costs (F=1, B=2; zb B=W=1); the measured idle/busy ratio of the
# oversubscribed run for reference; and peak activation memory per stage (validate's plan, which
# equals the arena byte for byte, test/sh/memory_plan_layouts.sh) for afab vs 1f1b (target: 1f1b
# flat as m grows, afab linear).
. "$(dirname "$0")/bench-lib.sh"
CFG=configs/bench-pp-llama.yaml
for m in 4 8 16; do
    for s in afab 1f1b interleaved zb; do
        v=1; [ $s = interleaved ] && v=3
        sets="--set parallel.pp_schedule=$s --set parallel.vpp=$v --set train.global_batch_size=$m"
        bench_run $s-$m 4 $CFG $sets
        $UST validate $CFG $sets --world 4 --schedule | tail -1 >"$TMP/$s-$m.sched"
        $UST validate $CFG $sets --world 4 | grep "pp rank" >"$TMP/$s-$m.plan"
    done
done
python3 - "$TMP" <<'PY'
import json, re, sys
tmp = sys.argv[1]
print("bench pp: llama 12 x 128, T=128, B=1, pp=4, 1 thread per rank (last of 3 steps)")
print(f"  {'schedule':12} {'m':>3} {'analytic':>9} {'sim(measured F/B/W)':>20} {'sim(unit)':>10}"
      f" {'run idle/busy':>14}   F/B/W ms")
for m in (4, 8, 16):
    for s in ("afab", "1f1b", "interleaved", "zb"):
        r = [json.loads(l) for l in open(f"{tmp}/{s}-{m}.jsonl")][-1]
        unit = float(re.search(r"simulated bubble ([0-9.]+)", open(f"{tmp}/{s}-{m}.sched").read()).group(1))
        fbw = "/".join(f"{r[k]:.1f}" for k in ("pp_f_ms", "pp_b_ms", "pp_w_ms"))
        print(f"  {s:12} {m:3d} {r['pp_bubble_analytic']:9.3f} {r['pp_bubble_sim']:20.3f}"
              f" {unit:10.3f} {r['pp_bubble']:14.3f}   {fbw}")
print("peak activation memory per stage (MiB), pp ranks 0..3:")
def mib(x):
    n, u = x.split()
    return float(n) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1, "GiB": 1024}[u]
for s in ("afab", "1f1b", "zb"):
    for m in (4, 8, 16):
        acts = [mib(re.search(r"activations\s+([0-9.]+ \w+)", l).group(1))
                for l in open(f"{tmp}/{s}-{m}.plan")]
        run = [json.loads(l) for l in open(f"{tmp}/{s}-{m}.jsonl")][-1]["mem_acts"] / 2**20
        print(f"  {s:5} m={m:2d}  " + "  ".join(f"{a:6.2f}" for a in acts) +
              f"   (rank 0 arena {run:.2f})")
PY
