#!/usr/bin/env python3
"""Shards of examples of given lengths for the packing tests and benchmark: byte tokens, each
example ended by the end of text 256, every token a target (version 1) unless --mask.

  pack_lengths.py DIR L1,L2,...           examples of these lengths (end of text included)
  pack_lengths.py DIR skewed N SEED       N lengths from a lognormal (median ~40, long tail)
Prints the concat figures for seq_len T=$T (env, default 128): examples cut by a window edge."""
import json
import os
import random
import struct
import sys


def main():
    out = sys.argv[1]
    if sys.argv[2] == "skewed":
        rng = random.Random(int(sys.argv[4]))
        lens = [max(2, min(4000, int(rng.lognormvariate(3.7, 0.9)))) for _ in range(int(sys.argv[3]))]
    else:
        lens = [int(x) for x in sys.argv[2].split(",")]
    rng = random.Random(1)
    toks = []
    for L in lens:
        toks += [rng.randrange(97, 123) for _ in range(L - 1)] + [256]
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/train_000.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *[0] * 253))
        f.write(struct.pack("<%dH" % len(toks), *toks))
    json.dump({"tokenizer": "bytes", "eot_id": 256, "vocab_size": 257}, open(f"{out}/meta.json", "w"))
    T = int(os.environ.get("T", "128"))
    cut, at = 0, 0
    for L in lens:  # concat: windows [kT, kT+T+1); an example crossing kT+T is cut
        if at // T != (at + L - 1) // T:
            cut += 1
        at += L
    print(f"{len(lens)} examples, {len(toks)} tokens; concat: 0% padding, {100 * cut / len(lens):.1f}% "
          f"of examples cut across windows of {T}+1")


main()
