#!/usr/bin/env python3
"""Renders ustrain metrics files (logging.metrics_file, one JSON object per step; keys written by
core/base/log.c) to PNGs; several runs are overlaid, each labelled by its run directory's name.
Run it through scripts/plot, which makes sure matplotlib is there.

  plot_metrics.py [-o OUTDIR] [--timeline TRACE] [--moe METRICS] metrics.jsonl...

Writes OUTDIR/{loss, lr, grad_norm, tokens_per_s, mfu, memory, data, moe, overview}.png (a panel
is left out when no run has that metric: data is a blend's samples per dataset, data_samples;
moe is each MoE layer's load imbalance, its busiest expert's tokens over the mean) and prints one
line per file with the runs and points it holds.
A resumed run appends to its metrics file and may log a step again: the last line for a step
wins. Bad input (a missing, empty or non-JSON-lines file) exits 2 with the reason."""
import argparse
import json
import math
import os
import sys

# (file stem, title, y label, [(key, line style suffix)], scale)
PANELS = [
    ("loss", "loss", "cross-entropy", [("loss", "train"), ("val_loss", "val")], 1.0),
    ("lr", "learning rate", "lr", [("lr", "")], 1.0),
    ("grad_norm", "gradient norm (before clipping)", "global L2 norm", [("grad_norm", "")], 1.0),
    ("tokens_per_s", "throughput", "tokens / s", [("tokens_per_s", "")], 1.0),
    ("mfu", "model FLOPs utilization", "MFU (%)", [("mfu", "")], 100.0),
    ("memory", "peak memory", "MiB", [("peak_mem_bytes", "")], 1.0 / (1 << 20)),
    ("data", "samples per dataset (blend)", "samples", "data_samples", 1.0),
    ("moe", "MoE load imbalance", "busiest expert / mean", "moe", 1.0),
]


def indexed(rows, key):
    """[(suffix, xs, ys)] of a per-step list: data_samples (one line per dataset) or moe (one
    line per layer: load_max / load_mean)."""
    lines = {}
    for s, r in sorted(rows.items()):
        v = r.get(key)
        if not isinstance(v, list):
            continue
        for i, item in enumerate(v):
            if key == "moe":
                if not isinstance(item, dict):
                    continue
                mx, mean = item.get("load_max"), item.get("load_mean")
                if not all(isinstance(a, (int, float)) for a in (mx, mean)) or not mean:
                    continue
                name, y = f"layer {item.get('layer', i)}", mx / mean
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                name, y = f"dataset {i}", float(item)
            else:
                continue
            if math.isfinite(y):
                lines.setdefault(name, ([], []))
                lines[name][0].append(s)
                lines[name][1].append(y)
    return [(name, xs, ys) for name, (xs, ys) in lines.items()]


def panel_lines(rows, keys, scale):
    """[(kind, xs, ys)] of one run in a panel."""
    if isinstance(keys, str):
        return indexed(rows, keys)
    return [(kind, *series(rows, key, scale)) for key, kind in keys]


def die(msg):
    print(f"plot: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    """-> {step: row} with the last row for each step."""
    if not os.path.isfile(path):
        die(f"{path}: no such file")
    rows = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{path}:{n}: not a JSON line ({e.msg}); expected ustrain's metrics.jsonl")
            if not isinstance(r, dict) or not isinstance(r.get("step"), (int, float)):
                die(f'{path}:{n}: a metrics line needs a numeric "step"')
            rows[int(r["step"])] = r
    if not rows:
        die(f"{path}: empty, no metrics to plot")
    return rows


def labels(paths):
    """Run names: the metrics file's directory name, widened with parents until they differ."""
    parts = [os.path.abspath(p).split(os.sep)[:-1] or ["."] for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{n} #{i + 1}" for i, n in enumerate(names)]


def series(rows, key, scale):
    pts = [(s, r.get(key)) for s, r in sorted(rows.items())]
    pts = [(s, v * scale) for s, v in pts
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return [p[0] for p in pts], [p[1] for p in pts]


def draw(ax, panel, runs, colors):
    stem, title, ylabel, keys, scale = panel
    counts = []
    dashes = ["-", "--", ":", "-."]
    for (name, rows), color in zip(runs, colors):
        n = 0
        lines = panel_lines(rows, keys, scale)
        for i, (kind, x, y) in enumerate(lines):
            if not x:
                continue
            label = f"{name} {kind}".strip() if len(lines) > 1 else name
            style = dict(linestyle="--", marker="o", markersize=3) if kind == "val" else {}
            if isinstance(keys, str):
                style = dict(linestyle=dashes[i % len(dashes)])
            ax.plot(x, y, color=color, linewidth=1.2, label=label, **style)
            n += len(x)
        if n:
            counts.append((name, n))
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    # the norm spans decades (a spike early, then slow decay): log, when every value allows it
    if stem == "grad_norm" and all(v > 0 for _, rows in runs for v in series(rows, keys[0][0], 1)[1]):
        ax.set_yscale("log")
    if counts:
        ax.legend(fontsize=8)
    return counts


def main():
    # the whole first paragraph: its first line alone stops mid-sentence
    ap = argparse.ArgumentParser(
        prog="scripts/plot",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog=" ".join(__doc__.split("\n\n", 2)[2].split()),
    )
    ap.add_argument("-o", "--out", default="plots", help="output directory (default: plots)")
    ap.add_argument("--timeline", metavar="TRACE",
                    help="a merged trace (logging.trace's trace.json) as a Gantt chart, "
                         "OUTDIR/timeline.png (scripts/plot_timeline.py)")
    ap.add_argument("--moe", metavar="METRICS",
                    help="a MoE run's metrics file as heat maps of the expert load, "
                         "OUTDIR/moe_load.png (scripts/plot_moe.py)")
    ap.add_argument("files", nargs="*", metavar="metrics.jsonl")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if a.timeline:
        from plot_timeline import plot_timeline
        plot_timeline(a.timeline, a.out)
    if a.moe:
        from plot_moe import plot_moe
        plot_moe(a.moe, a.out)
    if (a.timeline or a.moe) and not a.files:
        return
    if not a.files:
        die("no metrics file given; usage: scripts/plot [-o OUTDIR] metrics.jsonl...")
    runs = list(zip(labels(a.files), [load(p) for p in a.files]))
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        die(f"-o {a.out}: exists and is not a directory")
    os.makedirs(a.out, exist_ok=True)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(runs))]
    present = [p for p in PANELS
               if any(xs for _, rows in runs for _, xs, _ in panel_lines(rows, p[3], 1))]
    for panel in present:
        fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
        counts = draw(ax, panel, runs, colors)
        fig.tight_layout()
        path = os.path.join(a.out, panel[0] + ".png")
        fig.savefig(path)
        plt.close(fig)
        desc = ", ".join(f"{n} ({k} points)" for n, k in counts)
        print(f"{path}: {len(counts)} run(s): {desc}")
    cols = 2
    nrows = (len(present) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(12, 3.6 * nrows), dpi=100, squeeze=False)
    for ax, panel in zip(axes.flat, present):
        draw(ax, panel, runs, colors)
    for ax in list(axes.flat)[len(present):]:
        ax.axis("off")
    fig.tight_layout()
    path = os.path.join(a.out, "overview.png")
    fig.savefig(path)
    plt.close(fig)
    print(f"{path}: {len(present)} panels, {len(runs)} run(s)")


if __name__ == "__main__":
    main()
