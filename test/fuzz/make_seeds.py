#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into test/fuzz/corpus/<target>/ (small valid
inputs of each format, so the fuzzer starts from the accepted paths). The committed seeds were made
by this script; regression inputs found by fuzzing are added beside them by hand (crash-*)."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def config():
    for c in ("tiny.yaml", "tiny-gpt2.yaml", "tiny-3d.yaml"):
        shutil.copy(os.path.join(ROOT, "configs", c), os.path.join(HERE, "corpus", "config", c))
    put("config", "set.yaml", "#set model.moe.top_k=1\nmodel: {n_layer: 2, moe: {num_experts: 4}}\n")
    put("config", "flow.yaml", "train:\n  steps: 3\n  seq_len: 16\nparallel: {dp: 2, sp: true}\n")
    put("config", "anchors.yaml", "a: &x {n_layer: 2}\nmodel: *x\n")
    # the hardening limits: nesting just past the depth limit, list items past 32 bits, empty
    put("config", "deep.yaml", "train: " + "[" * 70 + "]" * 70 + "\n")
    put("config", "pp_layers_wrap.yaml", "parallel: {pp: 2, pp_layers: [4294967297, 3]}\n")
    put("config", "empty_set.yaml", "#set model.n_layer=2147483647\n~\n")


def data():
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    hdr = struct.pack("<256i", *([20240520, 1, len(toks)] + [0] * 253))
    put("data", "llmc_u16", bytes([0]) + hdr + struct.pack("<%dH" % len(toks), *toks))
    hdr = struct.pack("<256i", *([20240801, 1, len(toks)] + [0] * 253))
    put("data", "llmc_u32_vocab512", bytes([3]) + hdr + struct.pack("<%dI" % len(toks), *toks))
    put("data", "nanogpt", bytes([1]) + struct.pack("<%dH" % len(toks), *toks))
    sizes = [4, 7]
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 8, len(sizes), len(sizes) + 1)
    idx += struct.pack("<%di" % len(sizes), *sizes) + struct.pack("<2q", 0, 8)
    idx += struct.pack("<3q", 0, 1, 2)
    put("data", "megatron_u16", bytes([2]) + struct.pack("<I", len(idx)) + idx +
        struct.pack("<%dH" % len(toks), *toks))


def safetensors(tensors):
    meta, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        meta[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + 4 * n]}
        blob += struct.pack("<%df" % n, *[0.5 * i for i in range(n)])
    h = json.dumps(meta, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def ckpt():
    state = json.dumps({"format": "ustrain-checkpoint-1", "step": 10, "sample": 80,
                        "loss": 2.5}).encode()
    st = safetensors([("model.embed_tokens.weight", [4, 3]), ("model.norm.weight", [3])])
    put("ckpt", "step", struct.pack("<I", len(state)) + state + st)
    put("ckpt", "bf16", struct.pack("<I", 2) + b"{}" + struct.pack("<Q", 64) +
        b'{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'.ljust(64) + b"\0" * 4)


def frame(op, a=0, b=0, key=b"", val=b""):
    body = struct.pack("<IBBHIII", 0x31545355, op, 0, len(key), a, b, len(val)) + key + val
    return struct.pack("<I", len(body)) + body


def store():
    put("store", "hello", frame(1, 0, 2, val=b"0123456789abcdef"))
    put("store", "session", frame(1, 1, 2) + frame(2, 1, key=b"ust.host", val=b"node0") +
        frame(3, 0, 1000, key=b"ust.host") + frame(4, 0, 500) + frame(5))
    put("store", "replies", frame(16, val=b"env-00ff") + frame(17, val=b"x" * 40) +
        frame(18, val=b"rank 1 missing") + frame(19, val=b"bad"))


def hf():
    """config.json + model.safetensors of micro models (hf_make_model.py's writers at 1 layer,
    d_model 4), framed as fuzz_hf reads them: the config's length (4 bytes) first."""
    import sys, tempfile
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    import hf_make_model as mm
    mm.DIMS.update(L=1, C=4, H=2, KV=1, F=4, V=8, T=4, E=2, K=1, FE=4)
    for kind, dtype in [("llama", "f32"), ("llama_tied", "f16"), ("llama3", "f32"),
                        ("qwen2", "bf16"), ("mixtral", "bf16"), ("gpt2", "bf16")]:
        with tempfile.TemporaryDirectory() as d:
            mm.make(kind, d, dtype)
            cfg = json.dumps(json.load(open(os.path.join(d, "config.json"))),
                             separators=(",", ":")).encode()
            st = open(os.path.join(d, "model.safetensors"), "rb").read()
            put("hf", f"{kind}_{dtype}", struct.pack("<I", len(cfg)) + cfg + st)


def prep():
    """Byte 0: 0/2 an input file (2: binary allowed), 1 a meta.json; then the file."""
    import gzip
    text = b"hello world\nthe cat sat on the mat\n" * 20
    put("prep", "text", b"\x00" + text)
    put("prep", "jsonl", b"\x00" + b'{"text": "a"}\n{"text": "b"}\n')
    put("prep", "gzip", b"\x00" + gzip.compress(text))
    put("prep", "gzip_members", b"\x00" + gzip.compress(text) + gzip.compress(b"more\n"))
    put("prep", "gzip_cut", b"\x00" + gzip.compress(text)[:30])
    # a zstd frame of the text (the magic, then the frame as libzstd writes it)
    try:
        import zstandard
        put("prep", "zstd", b"\x00" + zstandard.ZstdCompressor().compress(text))
    except ImportError:
        import subprocess
        z = subprocess.run(["zstd", "-q", "-c"], input=text, capture_output=True).stdout
        if z:
            put("prep", "zstd", b"\x00" + z)
    put("prep", "binary", b"\x02" + bytes(range(256)))
    put("prep", "meta", b"\x01" + json.dumps({"tokenizer": "bytes", "eot_id": 256, "vocab_size": 257,
                                                "token_bytes": 2, "format": "llmc"}).encode())
    put("prep", "meta_bad", b"\x01" + b'{"vocab_size": -5, "eot_id": 1e40}')


if __name__ == "__main__":
    config(), data(), ckpt(), store(), hf(), prep()
