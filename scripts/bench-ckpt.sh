#!/usr/bin/env bash
# The checkpoint benchmark of `make bench`: GPT-2 124M (B=4, T=64, fp32, 2 threads; a checkpoint
# of 1.4 GiB: weights and both AdamW moments) trained STEPS steps three times in one go: without
# checkpoints, with a synchronous save every EVERY steps, and with checkpoint.async. Prints what a
# save costs the step loop in each mode: the time the loop waited in it (the async staging copy,
# and any wait for the previous save) and, measured against the run without saves, the whole
# step time lost (for async this includes the writer thread's competition for the cores).
# Target (issue 23): the step time lost to an async save <= 10% of a synchronous save's.
. "$(dirname "$0")/bench-lib.sh"
STEPS=${STEPS:-9} EVERY=${EVERY:-3}
run() { # run NAME [--set ...]: the loop's elapsed seconds at the last step, and its saves
    "$UST" train configs/bench-gpt2-124m.yaml --set train.steps=$STEPS --set checkpoint.dir=$TMP/$1 \
        --set "logging.metrics_file=$TMP/$1.jsonl" "${@:2}" >"$TMP/$1.out" 2>&1 ||
        { echo "bench-ckpt: $1 failed:"; tail -5 "$TMP/$1.out"; exit 1; }
}
run none --set checkpoint.every=0
run sync --set checkpoint.every=$EVERY
run async --set checkpoint.every=$EVERY --set checkpoint.async=true
python3 - "$TMP" "$STEPS" "$EVERY" <<'PY'
import json, re, sys
tmp, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def elapsed(name):  # the loop's time up to the last step's record (its final save is after it)
    return [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")][-1]["elapsed_s"]
def waited(name):
    m = re.search(r"checkpoints: (\d+) saved .*waited ([0-9.]+) ms per save", open(f"{tmp}/{name}.out").read())
    return int(m.group(1)), float(m.group(2))
inside = (steps - 1) // every  # saves before the last step's record
base = elapsed("none")
print(f"bench ckpt: GPT-2 124M, B=4 T=64, 2 threads, {steps} steps, a save every {every} "
      f"({inside} inside the timed loop)")
lost = {}
for mode in ("sync", "async"):
    n, w = waited(mode)
    lost[mode] = (elapsed(mode) - base) / inside * 1e3
    print(f"  {mode:5s}  the loop waited {w:8.1f} ms per save;  step time lost per save "
          f"{lost[mode]:8.1f} ms (vs {base:.2f} s without saves)")
print(f"  async / sync step time lost: {lost['async'] / lost['sync']:.2f} (target <= 0.10)")
PY
