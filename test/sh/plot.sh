#!/usr/bin/env bash
# scripts/plot: a real run's metrics and a synthetic one (a resumed step logged twice, a
# non-finite loss written as null) are rendered to valid, non-trivial PNGs in which both runs'
# colours appear; the per-file summary counts each run's points; bad input exits 2.
. "$(dirname "$0")/../lib.sh"

# runA: a real tiny training with validation every 3 steps
$UST data demo $TMP/data >/dev/null
cat >$TMP/a.yaml <<EOT
run:   {name: plot-a, seed: 3}
model: {arch: llama, n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, d_ff: 64, vocab_size: 300, max_seq_len: 32}
train: {steps: 6, seq_len: 16, micro_batch_size: 2, global_batch_size: 2}
data:  {train: "$TMP/data/train_*.bin", val: "$TMP/data/val_*.bin", val_every: 3, val_steps: 1}
checkpoint: {dir: $TMP/runA/ckpt, every: 0}
logging: {metrics_file: $TMP/runA/metrics.jsonl}
EOT
$UST train $TMP/a.yaml >$TMP/a.log 2>&1 || fail plot_training_for_metrics "$(tail -2 $TMP/a.log)"
# runB: 20 steps; step 5 logged twice (a resume re-ran it: the last line counts), step 7's loss
# non-finite (null), val_loss every 5 steps
mkdir -p $TMP/runB
python3 - $TMP/runB/metrics.jsonl <<'EOF'
import json, math, sys
rows = []
for s in list(range(1, 6)) + list(range(5, 21)):
    r = {"step": s, "loss": 6 * math.exp(-s / 8), "lr": 1e-3 * min(1, s / 5), "grad_norm": 3 / s,
         "tokens_per_s": 5000 + 100 * s, "mfu": 0.3 + 0.01 * (s % 3), "peak_mem_bytes": 40 << 20}
    if s == 7:
        r["loss"] = None
    if s % 5 == 0:
        r["val_loss"] = 6 * math.exp(-s / 8) + 0.1
    rows.append(r)
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
EOF

out=$(scripts/plot -o $TMP/plots $TMP/runA/metrics.jsonl $TMP/runB/metrics.jsonl 2>&1)
rc=$?
[ $rc = 0 ] && pass plot_two_runs_exits_0 || fail plot_two_runs_exits_0 "exit $rc: $(echo "$out" | tail -3)"
# runA: 6 train losses + val at 3 and 6; runB: 20 distinct steps less the null + 4 val losses
echo "$out" | grep -q "loss.png: 2 run(s): runA (8 points), runB (23 points)" &&
    pass plot_counts_each_runs_points_last_line_per_step_wins ||
    fail plot_counts_each_runs_points_last_line_per_step_wins "$(echo "$out" | grep loss.png)"

# Every PNG: the signature, an IHDR of at least 600x400, and drawn content. The decoder (stdlib
# zlib + PNG row filters) counts pixels of matplotlib's first two tab10 colours (the two runs), pure or antialiased.
python3 - $TMP/plots <<'EOF'
import os, struct, sys, zlib
d = sys.argv[1]
def pixels(path):
    b = open(path, "rb").read()
    if b[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    pos, idat, ihdr = 8, b"", None
    while pos < len(b):
        n, kind = struct.unpack(">I4s", b[pos:pos + 8])
        data = b[pos + 8:pos + 8 + n]
        if kind == b"IHDR": ihdr = struct.unpack(">IIBBBBB", data)
        if kind == b"IDAT": idat += data
        pos += 12 + n
    w, h, depth, ctype = ihdr[:4]
    if depth != 8 or ctype not in (2, 6):
        raise ValueError(f"unexpected PNG format depth {depth} colour type {ctype}")
    bpp = 4 if ctype == 6 else 3
    raw, stride, prev, rows, i = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            c = prev[x - bpp] if x >= bpp else 0
            p = a + prev[x] - c
            pa, pb, pc = abs(p - a), abs(p - prev[x]), abs(p - c)
            pred = [0, a, prev[x], (a + prev[x]) // 2,
                    a if pa <= pb and pa <= pc else (prev[x] if pb <= pc else c)][f]
            line[x] = (line[x] + pred) & 255
        rows.append(bytes(line)); prev = line
    return w, h, bpp, rows
blue, orange = (0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e)
def mix_of(px, col):
    """px is col blended with white at coverage >= 0.5 (antialiased lines are mostly blends)."""
    ts = [(255 - p) / (255 - c) for p, c in zip(px, col) if c < 200]
    whites_ok = all(p >= 235 for p, c in zip(px, col) if c >= 200)
    return whites_ok and min(ts) >= 0.5 and max(ts) - min(ts) <= 0.12
for name in ["loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory", "overview"]:
    path = os.path.join(d, name + ".png")
    try:
        w, h, bpp, rows = pixels(path)
        count = {blue: 0, orange: 0}
        for r in rows:
            for x in range(0, len(r), bpp):
                px = tuple(r[x:x + 3])
                if px != (255, 255, 255):
                    for col in count:
                        count[col] += mix_of(px, col)
        ok = w >= 600 and h >= 400 and count[blue] > 50 and count[orange] > 50
        why = f"{w}x{h}, {count[blue]} blue (runA) and {count[orange]} orange (runB) pixels"
    except Exception as e:
        ok, why = False, f"{path}: {e}"
    print(f"PASS plot_{name}_png_is_valid_and_shows_both_runs" if ok else
          f"FAIL plot_{name}_png_is_valid_and_shows_both_runs: {why}")
EOF

# runs whose directories share a name are told apart by their parents
mkdir -p $TMP/x/run $TMP/y/run
cp $TMP/runB/metrics.jsonl $TMP/x/run/ && cp $TMP/runB/metrics.jsonl $TMP/y/run/
scripts/plot -o $TMP/plots2 $TMP/x/run/metrics.jsonl $TMP/y/run/metrics.jsonl 2>&1 |
    grep -q "lr.png: 2 run(s): x/run (20 points), y/run (20 points)" &&
    pass plot_labels_distinguish_same_named_runs || fail plot_labels_distinguish_same_named_runs "labels not x/run, y/run"

# --- a blend's samples per dataset and the MoE load, from a real blended MoE run
mkdir -p $TMP/b2
python3 -c "
import struct, random
random.seed(2)
t = [random.randrange(0, 300) for _ in range(5000)]
open('$TMP/b2/train_000.bin', 'wb').write(struct.pack('<256i', 20240520, 1, len(t), *[0] * 253) + struct.pack(f'<{len(t)}H', *t))"
sed -e "s#train: \"$TMP/data/train_\*.bin\"#train: [{path: \"$TMP/data/train_*.bin\", weight: 1}, {path: \"$TMP/b2/train_*.bin\", weight: 3}]#" \
    -e 's/max_seq_len: 32}/max_seq_len: 32, moe: {num_experts: 4, top_k: 2, d_ff_expert: 16}}/' \
    -e "s#runA#runC#g" $TMP/a.yaml >$TMP/c.yaml
$UST train $TMP/c.yaml >$TMP/c.log 2>&1 || fail plot_blend_moe_training "$(tail -2 $TMP/c.log)"
out=$(scripts/plot -o $TMP/plots3 $TMP/runC/metrics.jsonl 2>&1)
echo "$out" | grep -q "data.png: 1 run(s): runC (12 points)" && echo "$out" | grep -q "moe.png: 1 run(s): runC (6 points)" &&
    pass plot_blend_samples_and_moe_load || fail plot_blend_samples_and_moe_load "$out"
out=$(scripts/plot -o $TMP/plots4 $TMP/runA/metrics.jsonl 2>&1)
! echo "$out" | grep -q "data.png\|moe.png" && pass plot_leaves_out_panels_without_data ||
    fail plot_leaves_out_panels_without_data "$out"

# --- bad input: exit 2 with the reason
expect_exit plot_missing_file_exits_2 2 "nonexistent.jsonl: no such file" -- scripts/plot -o $TMP/p3 $TMP/nonexistent.jsonl
: >$TMP/empty.jsonl
expect_exit plot_empty_file_exits_2 2 "empty.jsonl: empty, no metrics to plot" -- scripts/plot -o $TMP/p3 $TMP/empty.jsonl
printf '{"step": 1, "loss": 2}\nnot json\n' >$TMP/bad.jsonl
expect_exit plot_non_json_line_exits_2 2 "bad.jsonl:2: not a JSON line" -- scripts/plot -o $TMP/p3 $TMP/bad.jsonl
printf '{"loss": 2}\n' >$TMP/nostep.jsonl
expect_exit plot_line_without_step_exits_2 2 'nostep.jsonl:1: a metrics line needs a numeric "step"' -- \
    scripts/plot -o $TMP/p3 $TMP/nostep.jsonl
expect_exit plot_no_files_exits_2 2 "no metrics file given" -- scripts/plot -o $TMP/p3
[ ! -e $TMP/p3 ] && pass plot_bad_input_writes_nothing || fail plot_bad_input_writes_nothing "$TMP/p3 was created"
expect_exit plot_out_is_a_file_exits_2 2 "exists and is not a directory" -- \
    scripts/plot -o $TMP/a.yaml $TMP/runB/metrics.jsonl
# --help says what the tool does in whole sentences (the description is not cut mid-sentence)
out=$(scripts/plot --help 2>&1)
echo "$out" | grep -q 'labelled by its run directory' && echo "$out" | grep -q 'last line for a step wins' &&
    pass plot_help_is_not_cut_off || fail plot_help_is_not_cut_off "$(echo "$out" | head -5)"
