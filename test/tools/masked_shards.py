#!/usr/bin/env python3
"""Writes llm.c shards with a target mask (version 2: the tokens, then one bit per token, LSB
first) for the loss-mask tests, independently of ustrain's writer.

  masked_shards.py chat DIR VOCAB EOT N        N short "conversations": a prompt (not targets),
                                               a reply and its end of text (targets)
  masked_shards.py denom DIR VOCAB T           the denominator case: dataset A holds window X
                                               (every target) then a window of no target, B
                                               holds X twice (every target)
  masked_shards.py megatron SRC DST EOT        SRC's llm.c shards (chat) as Megatron datasets
                                               (PREFIX.bin/.idx, a sequence per document ended
                                               by EOT) with the PREFIX.mask target sidecar
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


def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<3i", b[:12])[2]
    toks = struct.unpack("<%dH" % n, b[1024:1024 + 2 * n])
    bits = b[1024 + 2 * n:]
    return list(toks), [(bits[i >> 3] >> (i & 7)) & 1 for i in range(n)]


def megatron(src, dst, eot):
    import glob, os
    for path in sorted(glob.glob(src + "/*_000.bin")):
        toks, flags = read(path)
        sizes, start = [], 0
        for i, t in enumerate(toks):  # a sequence per document; the tail is one too
            if t == eot or i == len(toks) - 1:
                sizes.append(i + 1 - start)
                start = i + 1
        prefix = dst + "/" + os.path.basename(path)[:-4]
        with open(prefix + ".bin", "wb") as f:
            f.write(struct.pack("<%dH" % len(toks), *toks))
        ptrs = [2 * sum(sizes[:k]) for k in range(len(sizes))]
        with open(prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 8, len(sizes), len(sizes) + 1))
            f.write(struct.pack("<%di" % len(sizes), *sizes))
            f.write(struct.pack("<%dq" % len(sizes), *ptrs))
            f.write(struct.pack("<%dq" % (len(sizes) + 1), *range(len(sizes) + 1)))
        bits = bytearray((len(toks) + 7) // 8)
        for i, fl in enumerate(flags):
            bits[i >> 3] |= fl << (i & 7)
        with open(prefix + ".mask", "wb") as f:
            f.write(b"USTMASK\0" + struct.pack("<QQ", 1, len(toks)) + bytes(bits))
    with open(src + "/meta.json") as f, open(dst + "/meta.json", "w") as g:
        g.write(f.read())


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    if kind == "megatron":
        megatron(out, sys.argv[3], int(sys.argv[4]))
    elif kind == "chat":
        chat(out, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        denom(out, int(sys.argv[3]), int(sys.argv[4]))
