#!/usr/bin/env python3
"""Writes llm.c shards with a target mask (version 2: the tokens, then one bit per token, LSB
first) for the loss-mask tests, independently of ustrain's writer.

  masked_shards.py chat DIR VOCAB EOT N        N short "conversations": a prompt (not targets),
                                               a reply and its end of text (targets)
  masked_shards.py denom DIR VOCAB T           the denominator case: dataset A holds window X
                                               (every target) then a window of no target, B
                                               holds X twice (every target)
Prints the count of target tokens of each dataset's windows where asked."""
import random
import struct
import sys


def write(path, toks, flags, version=2):
    hdr = [20240520, version, len(toks)] + [0] * 253
    bits = bytearray((len(toks) + 7) // 8)
    for i, f in enumerate(flags):
        if f:
            bits[i >> 3] |= 1 << (i & 7)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack("<%dH" % len(toks), *toks))
        if version == 2:
            f.write(bytes(bits))


def chat(out, vocab, eot, n):
    rng = random.Random(5)
    toks, flags = [], []
    for _ in range(n):
        p = [rng.randrange(eot) for _ in range(rng.randint(3, 20))]
        r = [rng.randrange(eot) for _ in range(rng.randint(1, 12))]
        toks += p + r + [eot]
        flags += [0] * len(p) + [1] * (len(r) + 1)
    cut = len(toks) * 9 // 10
    write(f"{out}/train_000.bin", toks[:cut], flags[:cut])
    write(f"{out}/val_000.bin", toks[cut:], flags[cut:])
    with open(f"{out}/meta.json", "w") as f:
        f.write('{"tokenizer": "bytes", "eot_id": %d, "vocab_size": %d}\n' % (eot, vocab))


def denom(out, vocab, T):
    rng = random.Random(3)
    X = [rng.randrange(vocab) for _ in range(T + 1)]
    X[T] = X[0]  # so that X + X[1:] holds window X twice
    write(f"{out}/a_000.bin", X + [rng.randrange(vocab) for _ in range(T)], [1] * (T + 1) + [0] * T)
    write(f"{out}/b_000.bin", X + X[1:], [1] * (2 * T + 1))


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    if kind == "chat":
        chat(out, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        denom(out, int(sys.argv[3]), int(sys.argv[4]))
