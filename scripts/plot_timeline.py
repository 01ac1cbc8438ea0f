"""scripts/plot --timeline TRACE: a merged ustrain trace (logging.trace, DIR/trace.json) as a Gantt
chart, one row per rank: F, B and W actions of the pipeline, other computation (optimizer), waits
on communicators, and idle time (nothing recorded) left white; one panel per traced step. Beside
each row, the rank's measured bubble ((makespan - busy) / busy, the makespan from the first rank's
first action to the last one's end, as the simulator counts it), and in the title the step's
simulated and analytic bubbles (its step span's arguments)."""
import json
import os
import sys

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "other": "#8172B3", "comm": "#C44E52"}


def die(msg):
    print(f"plot: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        d = json.load(open(path))
        ev = d["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        die(f"--timeline {path}: not a ustrain trace (Chrome trace-event JSON): {e}")
    steps = {}
    for e in ev:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("step "):
            steps.setdefault(e["args"]["step"], {})[e["pid"]] = e
    if not steps:
        die(f"--timeline {path}: no traced step (no 'step N' span)")
    return ev, steps


def kind(e):
    op = e.get("args", {}).get("op")
    if op in ("F", "B", "W") and not e["name"].startswith("val "):
        return op
    if "unit" in e.get("args", {}):  # an op group inside an action: drawn as its action
        return None
    tid = e["tid"] % 10  # the thread: ustrain's tids are 1000000 + 10 x rank + thread
    if tid == 1 and e["name"].startswith("wait "):
        return "comm"
    return "other" if tid == 0 and not e["name"].startswith("step ") else None


def step_rows(ev, by_rank):
    """{rank: [(kind, t0, dur)]} of one step (ms from its first action), and each rank's bubble."""
    rows, busy, first, last = {}, {}, [], []
    for r, s in by_rank.items():
        lo, hi = s["ts"], s["ts"] + s["dur"]
        mine = [(kind(e), e["ts"], e["dur"]) for e in ev
                if e.get("ph") == "X" and e["pid"] == r and lo <= e["ts"] <= hi and kind(e)]
        rows[r] = mine
        walk = [(t, d) for k, t, d in mine if k in ("F", "B", "W")]
        if walk:
            busy[r] = sum(d for _, d in walk)
            first.append(min(t for t, _ in walk))
            last.append(max(t + d for t, d in walk))
    t0 = min(first) if first else min(s["ts"] for s in by_rank.values())
    span = max(last) - t0 if last else 0
    bubble = {r: (span - b) / b for r, b in busy.items() if b > 0}
    return {r: [(k, (t - t0) / 1e3, d / 1e3) for k, t, d in v] for r, v in rows.items()}, bubble


def plot_timeline(path, out):
    ev, steps = load(path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    world = max(max(s) for s in steps.values()) + 1
    fig, axes = plt.subplots(len(steps), 1, figsize=(12, 0.6 * world * len(steps) + 1.5), dpi=80,
                             squeeze=False)
    lines = []
    for ax, (step, by_rank) in zip(axes[:, 0], sorted(steps.items())):
        rows, bubble = step_rows(ev, by_rank)
        for r, spans in rows.items():
            for k in ("comm", "other", "F", "B", "W"):  # actions drawn over waits
                bars = [(t, d) for kk, t, d in spans if kk == k]
                if bars:
                    ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=COLORS[k], edgecolor="none")
        a = by_rank[min(by_rank)]["args"]
        sim, ana = a.get("pp_bubble_sim", -1), a.get("pp_bubble_analytic", -1)
        ax.set_yticks(range(world))
        ax.set_yticklabels([f"rank {r}  bubble {bubble[r]:.3f}" if r in bubble else f"rank {r}"
                            for r in range(world)])
        ax.invert_yaxis()
        ax.set_xlabel("ms from the step's first action")
        ax.set_title(f"step {step}: measured bubble (max) "
                     f"{max(bubble.values()) if bubble else float('nan'):.3f}, simulated "
                     f"{sim:.3f}, analytic {ana:.3f}")
        ax.grid(True, axis="x", alpha=0.3)
        lines.append(f"step {step}: bubble per rank " +
                     " ".join(f"{r}:{b:.3f}" for r, b in sorted(bubble.items())) +
                     f"; simulated {sim:.3f}, analytic {ana:.3f}")
    fig.legend(handles=[Patch(color=c, label=k if k != "other" else "other compute")
                        for k, c in COLORS.items()] + [Patch(facecolor="white", edgecolor="grey", label="idle")],
               loc="lower center", ncol=6, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "timeline.png")
    fig.savefig(png)
    plt.close(fig)
    print(f"{png}: {world} ranks, {len(steps)} step(s)")
    for line in lines:
        print("  " + line)
