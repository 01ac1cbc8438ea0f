"""Checks a merged ustrain trace (logging.trace) as test/sh/trace.sh asks: Chrome trace-event JSON,
one process per rank, well-nested spans per thread, every operation issued before it completes,
the same collective numbers on every member of a group, and the pipeline bubble measured on the
timeline against the schedule's simulated one (the step span's args). Prints one line per check:
"ok NAME" or "bad NAME: why"; with --bubble prints the measured and simulated bubbles."""
import json
import sys
from collections import defaultdict


def load(path):
    d = json.load(open(path))
    assert isinstance(d["traceEvents"], list)
    return d


def nested(spans):
    """Spans [(t0, t1, name)] of one thread nest or are disjoint (1 us of float slack)."""
    stack = []
    for t0, t1, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1][1] <= t0 + 1.0:
            stack.pop()
        if stack and t1 > stack[-1][1] + 1.0:
            return "%s [%.1f, %.1f] overlaps %s [%.1f, %.1f]" % (name, t0, t1, stack[-1][2], stack[-1][0], stack[-1][1])
        stack.append((t0, t1, name))
    return None


def bubbles(ev):
    """Per traced step, the simulator's bubble read off the timeline: the walk's makespan from the
    first rank's first F/B/W to the last one's end (clocks aligned to rank 0), each rank's busy
    time the F/B/W spans inside its step, the bubble the largest (makespan - busy) / busy; beside
    the simulated one the step span carries (the schedule's timeline with the step's op times)."""
    out = []
    steps = defaultdict(dict)
    for e in ev:
        if e.get("ph") == "X" and e["name"].startswith("step "):
            steps[e["args"]["step"]][e["pid"]] = e
    for step, by_rank in sorted(steps.items()):
        busy, first, last = {}, [], []
        for r, s in by_rank.items():
            lo, hi = s["ts"], s["ts"] + s["dur"]
            walk = [e for e in ev if e.get("ph") == "X" and e["pid"] == r and lo <= e["ts"] <= hi
                    and e["args"].get("op") in ("F", "B", "W") and not e["name"].startswith("val ")]
            busy[r] = sum(e["dur"] for e in walk)
            first.append(min(e["ts"] for e in walk))
            last.append(max(e["ts"] + e["dur"] for e in walk))
        span = max(last) - min(first)
        meas = max((span - b) / b for b in busy.values())
        s0 = by_rank[0]
        out.append((step, meas, s0["args"]["pp_bubble_sim"], s0["args"]["pp_bubble_analytic"], max(busy.values()), s0["dur"]))
    return out


def main():
    d = load(sys.argv[1])
    ev = d["traceEvents"]
    world = d["ustrain"]["world"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    ok = sorted(names) == list(range(world)) and all(names[r] == "rank %d" % r for r in names)
    pids = {e["pid"] for e in ev if e.get("ph") != "M"}
    print(("ok" if ok and pids == set(range(world)) else "bad") + " one_process_per_rank", sorted(pids))
    by = defaultdict(list)
    for e in ev:
        if e.get("ph") == "X":
            assert e["dur"] >= 0, e
            by[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    # Perfetto takes a tid for a system-wide thread id: a tid two ranks share, or one equal to a
    # pid, merges their threads into one track
    owner = {}
    for e in ev:
        if "tid" in e:
            owner.setdefault(e["tid"], set()).add(e["pid"])
    clash = [t for t, p in owner.items() if len(p) > 1 or t in pids]
    print(("bad" if clash else "ok") + " thread_ids_unique_across_ranks", clash[:3])
    why = [w for w in (nested(v) for v in by.values()) if w]
    print(("bad" if why else "ok") + " spans_well_nested_per_thread", why[:1])
    op = {}
    bad = []
    for e in ev:
        if e.get("ph") in ("b", "e"):
            op.setdefault((e["pid"], e.get("cat"), e["id2"]["local"]), {})[e["ph"]] = e
    for k, v in op.items():
        if set(v) != {"b", "e"} or v["b"]["ts"] > v["e"]["ts"]:
            bad.append(k)
    print(("bad" if bad or not op else "ok") + " every_operation_issued_before_it_completes", len(op), bad[:2])
    colls = defaultdict(lambda: defaultdict(set))
    for (pid, cat, _), v in op.items():
        a = v["b"]["args"]
        if cat == "comm" and a["kind"] != "send_recv":
            colls[(a["group"], a["members"])][pid].add((a["coll"], a["kind"]))
    bad = [g for g, m in colls.items() if len({frozenset(s) for s in m.values()}) != 1]
    print(("bad" if bad or not colls else "ok") + " collective_numbers_match_across_members", len(colls), bad[:2])
    # each unit's (op group's) spans inside the pipeline action that ran it: fwd in an F, bwd and
    # bin in a B or W
    acts = defaultdict(list)
    for e in ev:
        if e.get("ph") == "X" and e["args"].get("op") in ("F", "B", "W"):
            acts[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["args"]["op"]))
    units, bad = 0, []
    for e in ev:
        kind = e["name"].split(" ")[0]
        if e.get("ph") != "X" or "unit" not in e["args"] or kind not in ("fwd", "bwd", "bin"):
            continue
        units += 1
        ops = ("F",) if kind == "fwd" else ("B", "W")
        if not any(a <= e["ts"] + 1 and e["ts"] + e["dur"] <= b + 1 and op in ops for a, b, op in acts[(e["pid"], e["tid"])]):
            bad.append(e["name"])
    print(("bad" if bad or not units else "ok") + " unit_spans_inside_their_actions", units, bad[:2])
    if "--bubble" in sys.argv:
        for step, meas, sim, ana, busy, dur in bubbles(ev):
            err = abs(meas - sim) * busy / dur  # the bubbles' difference as a share of the step
            print("%s bubble_step_%d timeline %.4f simulated %.4f analytic %.4f: %.1f%% of the step" % ("ok" if err <= 0.05 else "bad", step, meas, sim, ana, 100 * err))


main()
