#!/usr/bin/env bash
# The pipeline benchmark of `make bench`: a 12-layer llama at pp=4 (ranks oversubscribed on this
# machine, so wall time says little), m = 4, 8, 16 micro-batches per step, every schedule
# (interleaved with vpp=3; dualpipev with its V of 8 stages, 2+1 layers per rank and chunk pair,
# from m = 2p = 8 on; dualpipe with its 4 stages of 3 layers held twice, half the micro-batches
# entering at each end, from m = 8 on). Prints beside each other:
#   analytic    the published bubble for the measured mean F/B/W times: (p-1)/(v*m) for afab,
#               1f1b and interleaved (Narayanan et al.), ZB-H1's (p-1)(F+B-2W)/(m(F+B)) (Qi et
#               al.; DeepSeek-V3's table, B the whole backward), DeepSeek's DualPipeV
#               (PP/2-1)(F&B+B-3W)/(2m(F+B)) with PP = 2p stages and F&B = F+B, and DualPipe's
#               (PP/2-1)(F&B+B-3W)/(m(F+B)) with PP = p;
#   dataflow    the schedule's own bubble with unit costs (F=1, B=2; zb and dualpipev B=W=1):
#               computes as early as their inputs allow, transfers free and asynchronous;
#   sim(unit)   the same costs under ustrain's executor rule (blocking batched send/recv,
#               pp_schedule.h); sim(measured) that with the measured F/B/W times;
#   run         the measured idle/busy ratio of the oversubscribed run, for reference;
# and each pp rank's peak activation memory and parameter bytes (validate's plan, which equals the
# arena byte for byte, test/sh/memory_plan_layouts.sh, test/sh/equiv_dualpipe*.sh): dualpipe's
# price for its bubble is the second copy of every stage.
. "$(dirname "$0")/bench-lib.sh"
CFG=configs/bench-pp-llama.yaml
SCHEDS="afab 1f1b interleaved zb dualpipev dualpipe"
for m in 4 8 16; do
    for s in $SCHEDS; do
        sets="--set parallel.pp_schedule=$s --set train.global_batch_size=$m"
        case $s in
        interleaved) sets="$sets --set parallel.vpp=3" ;;
        dualpipev) [ $m -lt 8 ] && continue
            sets="$sets --set parallel.vpp=2 --set parallel.pp_layers=2,1,2,1,2,1,2,1" ;;
        dualpipe) [ $m -lt 8 ] && continue
            sets="$sets --set parallel.vpp=2" ;;
        esac
        bench_run $s-$m 4 $CFG $sets
        $UST validate $CFG $sets --world 4 --schedule | tail -1 >"$TMP/$s-$m.sched"
        $UST validate $CFG $sets --world 4 | grep "pp rank" >"$TMP/$s-$m.plan"
    done
done
python3 - "$TMP" $SCHEDS <<'PY'
import json, os, re, sys
tmp, scheds = sys.argv[1], sys.argv[2:]
print("bench pp: llama 12 x 128, T=128, B=1, pp=4, 1 thread per rank (last of 3 steps)")
print(f"  {'schedule':12} {'m':>3} {'analytic':>9} {'dataflow':>9} {'sim(unit)':>10}"
      f" {'sim(measured)':>14} {'run':>7}   F/B/W ms")
for m in (4, 8, 16):
    for s in scheds:
        if not os.path.exists(f"{tmp}/{s}-{m}.jsonl"):
            print(f"  {s:12} {m:3d}   (needs m >= 2p = 8)")
            continue
        r = [json.loads(l) for l in open(f"{tmp}/{s}-{m}.jsonl")][-1]
        line = open(f"{tmp}/{s}-{m}.sched").read()
        unit = float(re.search(r"simulated bubble ([0-9.]+)", line).group(1))
        flow = float(re.search(r"dataflow bubble ([0-9.-]+)", line).group(1))
        fbw = "/".join(f"{r[k]:.1f}" for k in ("pp_f_ms", "pp_b_ms", "pp_w_ms"))
        print(f"  {s:12} {m:3d} {r['pp_bubble_analytic']:9.3f} {flow:9.3f} {unit:10.3f}"
              f" {r['pp_bubble_sim']:14.3f} {r['pp_bubble']:7.3f}   {fbw}")
print("peak activation memory | parameters per pp rank (MiB), ranks 0..3:")
def mib(x):
    n, u = x.split()
    return float(n) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1, "GiB": 1024}[u]
for s in scheds:
    for m in (4, 8, 16):
        if not os.path.exists(f"{tmp}/{s}-{m}.plan"):
            continue
        lines = open(f"{tmp}/{s}-{m}.plan").readlines()
        acts = [mib(re.search(r"activations\s+([0-9.]+ \w+)", l).group(1)) for l in lines]
        par = [mib(re.search(r"parameters\s+([0-9.]+ \w+)", l).group(1)) for l in lines]
        run = [json.loads(l) for l in open(f"{tmp}/{s}-{m}.jsonl")][-1]["mem_acts"] / 2**20
        print(f"  {s:11} m={m:2d}  " + "  ".join(f"{a:6.2f}" for a in acts) + "  |" +
              "  ".join(f"{a:6.2f}" for a in par) + f"   (rank 0 arena acts {run:.2f})")
PY
