"""scripts/plot --moe METRICS: a MoE run's expert load (logging.metrics_file's "moe" entries) as
heat maps, OUTDIR/moe_load.png: for each MoE layer (rows) the share of the tokens each expert
(columns) took, over the logged steps (the last step's beside their mean), and each layer's
overload factor (its busiest expert's tokens over the mean) over the steps."""
import json
import os
import sys


def die(msg):
    print(f"plot: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    rows = {}
    try:
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                if r.get("moe") and all("experts" in m for m in r["moe"]):
                    rows[r["step"]] = r["moe"]
    except (OSError, ValueError, TypeError, KeyError) as e:
        die(f"--moe {path}: not a metrics file: {e}")
    if not rows:
        die(f"--moe {path}: no step with per-expert MoE load (a run with MoE layers)")
    return rows


def plot_moe(path, out):
    rows = load(path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = sorted(rows)
    layers = [m["layer"] for m in rows[steps[-1]]]
    share = {}  # step -> layers x experts: tokens over the mean (1 = balanced)
    for s in steps:
        m = np.array([x["experts"] for x in rows[s]], dtype=float)
        share[s] = m / np.maximum(m.mean(axis=1, keepdims=True), 1e-12)
    over = np.array([[float(np.max(share[s][i])) for s in steps] for i in range(len(layers))])
    fig, axes = plt.subplots(1, 3, figsize=(15, 1.2 + 0.5 * len(layers) + 2), dpi=80)
    for ax, (title, m) in zip(axes[:2], [(f"step {steps[-1]}", share[steps[-1]]),
                                        (f"mean over {len(steps)} steps", np.mean([share[s] for s in steps], axis=0))]):
        im = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0)
        ax.set_title(f"tokens per expert / mean, {title}")
        ax.set_xlabel("expert")
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels([f"layer {l}" for l in layers])
        fig.colorbar(im, ax=ax)
    im = axes[2].imshow(over, aspect="auto", cmap="magma", vmin=1,
                        extent=(steps[0] - 0.5, steps[-1] + 0.5, len(layers) - 0.5, -0.5))
    axes[2].set_title("overload factor (max / mean) over steps")
    axes[2].set_xlabel("step")
    axes[2].set_yticks(range(len(layers)))
    axes[2].set_yticklabels([f"layer {l}" for l in layers])
    fig.colorbar(im, ax=axes[2])
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "moe_load.png")
    fig.savefig(png)
    plt.close(fig)
    print(f"{png}: {len(layers)} MoE layers x {share[steps[-1]].shape[1]} experts, {len(steps)} steps")
    for i, l in enumerate(layers):
        print(f"  layer {l}: overload last {over[i, -1]:.3f}, max {over[i].max():.3f}")
