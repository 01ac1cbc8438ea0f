#!/usr/bin/env python3
"""Reads a run's TensorBoard event files two independent ways and compares them with its JSONL.

  tb_check.py TB_DIR METRICS_JSONL

1. By hand: every record's framing (uint64 length, masked CRC32C of the length, data, masked
   CRC32C of the data; CRC32C written here from its definition) must check.
2. With the tensorboard package's EventAccumulator (which applies SessionLog START purges): every
   numeric key of every JSONL line must be there as a scalar of the same step, equal to float32
   rounding, but "time", which is the step's event wall_time (a double, to the JSONL's
   millisecond; no float32 scalar), and no step may appear twice. Prints PASS/FAIL lines (test/lib.sh style)."""
import glob
import json
import math
import os
import struct
import sys


def result(ok, name, why=""):
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}")
    return ok


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_framing(path):
    raw = open(path, "rb").read()
    pos, n = 0, 0
    while pos < len(raw):
        if pos + 12 > len(raw):
            return f"{path}: truncated record header at byte {pos}"
        head = raw[pos : pos + 8]
        (length,) = struct.unpack("<Q", head)
        (lcrc,) = struct.unpack("<I", raw[pos + 8 : pos + 12])
        if lcrc != masked(head):
            return f"{path}: record {n}: length CRC {lcrc:#x}, expected {masked(head):#x}"
        data = raw[pos + 12 : pos + 12 + length]
        (dcrc,) = struct.unpack("<I", raw[pos + 12 + length : pos + 16 + length])
        if dcrc != masked(data):
            return f"{path}: record {n}: data CRC {dcrc:#x}, expected {masked(data):#x}"
        pos += 16 + length
        n += 1
    return None if n >= 2 else f"{path}: only {n} records"


def main():
    tb_dir, jsonl = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    problems = [p for p in (check_framing(f) for f in files) if p]
    result(files and not problems, "tb_records_frame_and_crc32c_check",
           "; ".join(problems) or "no event files")

    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    lines = [json.loads(l) for l in open(jsonl)]
    steps = [l["step"] for l in lines]
    result(len(steps) == len(set(steps)), "jsonl_has_no_duplicated_steps", f"steps {steps}")
    bad, compared = [], 0
    for tag in tags:
        seen = [e.step for e in acc.Scalars(tag)]
        if len(seen) != len(set(seen)):
            bad.append(f"{tag}: steps {seen} repeat")
    if "time" in tags:  # float32 holds unix seconds to 128 s: every value collapses
        bad.append("time is a float32 scalar: " + str(sorted({e.value for e in acc.Scalars("time")})[:3]))
    for l in lines:
        for k, v in l.items():
            if k == "step" or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if k == "time":  # the event's wall_time (a double), no float32 scalar
                walls = {e.wall_time for e in acc.Scalars("loss") if e.step == l["step"]}
                if len(walls) != 1 or abs(walls.pop() - v) > 6e-4:
                    bad.append(f"time at step {l['step']}: event wall_time {walls}, jsonl {v}")
                compared += 1
                continue
            if k not in tags:
                bad.append(f"{k} missing from the event files")
                continue
            got = [e.value for e in acc.Scalars(k) if e.step == l["step"]]
            want = float(struct.unpack("<f", struct.pack("<f", v))[0])
            if len(got) != 1 or not math.isclose(got[0], want, rel_tol=1e-6, abs_tol=1e-30):
                bad.append(f"{k} at step {l['step']}: events {got}, jsonl {v}")
            compared += 1
    result(not bad and compared > 0, "tb_scalars_equal_the_jsonl",
           "; ".join(sorted(set(bad))[:6]) or "nothing compared")
    print(f"  compared {compared} values of {len(lines)} steps, {len(tags)} tags, {len(files)} files")


if __name__ == "__main__":
    main()
