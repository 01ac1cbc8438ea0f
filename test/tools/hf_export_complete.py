#!/usr/bin/env python3
"""Checks the parts of `ustrain export --to hf` beyond the fp32 layout (test/sh/export_complete.sh),
independently of the C code. Prints PASS/FAIL lines (test/lib.sh style); numpy only, except the
`transformers` mode.

  hf_export_complete.py dtype TAG OUT_FP32 OUT DTYPE
      OUT's single model.safetensors holds every tensor of OUT_FP32's in DTYPE (bf16 | fp16),
      each value the nearest one (ties to even): fp16 as numpy's float16 conversion rounds,
      bf16 checked against both neighbours of the value written. config.json says torch_dtype.
  hf_export_complete.py shards TAG OUT_SINGLE OUT_SHARDED MAX_BYTES
      OUT_SHARDED holds model-0000K-of-0000N.safetensors and model.safetensors.index.json (no
      model.safetensors); the index's weight_map names every tensor once, in the shard that holds
      it, metadata.total_size is the sum of the data; every shard is at most MAX_BYTES of data
      unless it holds one tensor; the tensors equal OUT_SINGLE's.
  hf_export_complete.py transformers TAG OUT TEXT_FILE EOT SHARD...
      transformers' AutoTokenizer.from_pretrained(OUT) encodes TEXT_FILE (add_special_tokens=False)
      to exactly the tokens of the shards (train then val), the end-of-text EOT after it; the
      tokenizer's eos, AutoConfig's and GenerationConfig's bos/eos ids are EOT."""
import glob
import json
import os
import struct
import sys

import numpy as np


def result(ok, name, why=""):
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}")
    return ok


RAW = {"F32": "<f4", "BF16": "<u2", "F16": "<u2"}


def read(path):
    """-> (header, {name: array}); BF16/F16 data as their raw uint16 bits."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=RAW[e["dtype"]]).reshape(e["shape"])
    return header, out


def bf16_nearest(x, bits):
    """True where bits (bf16) is the bf16 value nearest x, ties to an even mantissa."""
    def val(b):
        return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    r, up, down = val(bits), val(bits + 1), val(bits - 1)
    x = x.astype(np.float64)
    d, du, dd = np.abs(x - r), np.abs(x - up), np.abs(x - down)
    du, dd = np.where(np.isnan(du), np.inf, du), np.where(np.isnan(dd), np.inf, dd)  # past +-0
    tie_ok = ((d < du) | ((d == du) & (bits % 2 == 0))) & ((d < dd) | ((d == dd) & (bits % 2 == 0)))
    return (d <= du) & (d <= dd) & tie_ok


def check_dtype(tag, ref_dir, out, dtype):
    _, ref = read(f"{ref_dir}/model.safetensors")
    header, got = read(f"{out}/model.safetensors")
    want = {"bf16": "BF16", "fp16": "F16"}[dtype]
    dts = {e["dtype"] for k, e in header.items() if k != "__metadata__"}
    result(dts == {want} and set(got) == set(ref), f"{tag}_every_tensor_is_{dtype}",
           f"dtypes {dts}, names equal: {set(got) == set(ref)}")
    bad = []
    for n, x in ref.items():
        if n not in got or got[n].shape != x.shape:
            bad.append(n)
        elif dtype == "fp16" and not np.array_equal(got[n], x.astype(np.float16).view(np.uint16)):
            bad.append(n)
        elif dtype == "bf16" and not bf16_nearest(x, got[n]).all():
            bad.append(n)
    result(not bad, f"{tag}_values_round_to_nearest_even", f"{len(bad)} tensors differ: {bad[:3]}")
    cfg = json.load(open(f"{out}/config.json"))
    torch_name = {"bf16": "bfloat16", "fp16": "float16"}[dtype]
    result(cfg.get("torch_dtype") == torch_name, f"{tag}_config_torch_dtype",
           f"torch_dtype {cfg.get('torch_dtype')}")


def check_shards(tag, single, sharded, max_bytes):
    files = sorted(os.path.basename(f) for f in glob.glob(f"{sharded}/model*.safetensors*"))
    shards = [f for f in files if f.endswith(".safetensors")]
    n = len(shards)
    names = [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    result(n > 1 and shards == names and "model.safetensors.index.json" in files,
           f"{tag}_shards_are_named_as_transformers_names_them", f"files {files}")
    index = json.load(open(f"{sharded}/model.safetensors.index.json"))
    wm = index.get("weight_map", {})
    _, ref = read(f"{single}/model.safetensors")
    seen, total, problems = {}, 0, []
    for s in shards:
        _, t = read(f"{sharded}/{s}")
        size = sum(a.nbytes for a in t.values())
        total += size
        if size > max_bytes and len(t) > 1:
            problems.append(f"{s}: {size} bytes in {len(t)} tensors > {max_bytes}")
        for k, a in t.items():
            if k in seen:
                problems.append(f"{k} in {seen[k]} and {s}")
            seen[k] = s
            if wm.get(k) != s:
                problems.append(f"weight_map[{k}] = {wm.get(k)}, held by {s}")
            if k not in ref or not np.array_equal(ref[k], a):
                problems.append(f"{k} differs from the single-file export")
    if set(seen) != set(ref) or set(wm) != set(ref):
        problems.append("the shards' tensors are not the single file's")
    result(not problems, f"{tag}_shards_hold_every_tensor_once_within_the_limit",
           "; ".join(problems[:3]))
    result(index.get("metadata", {}).get("total_size") == total, f"{tag}_index_total_size",
           f"total_size {index.get('metadata')} vs {total} bytes of data")


def shard_tokens(paths):
    out = []
    for p in paths:
        hdr = np.fromfile(p, dtype=np.int32, count=256)
        dt = np.uint16 if hdr[0] == 20240520 else np.uint32
        out.extend(np.fromfile(p, dtype=dt, offset=1024).astype(np.int64).tolist())
    return out


def check_transformers(tag, out, text_file, eot, shards):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = open(text_file, encoding="utf-8", newline="").read()
    ids = tok.encode(text, add_special_tokens=False) + [eot]
    want = shard_tokens(shards)
    first = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
    result(ids == want, f"{tag}_autotokenizer_encodes_as_the_training_data",
           f"{len(ids)} vs {len(want)} tokens, first difference at {first}: "
           f"{ids[first:first + 5]} vs {want[first:first + 5]}")
    result(tok.decode(ids[:-1]) == text, f"{tag}_autotokenizer_decodes_the_text_back",
           "decode(encode(text)) != text")
    cfg = transformers.AutoConfig.from_pretrained(out)
    gen = transformers.GenerationConfig.from_pretrained(out)
    got = (tok.eos_token_id, tok.bos_token_id, cfg.bos_token_id, cfg.eos_token_id,
           gen.bos_token_id, gen.eos_token_id)
    result(got == (eot,) * 6, f"{tag}_special_token_ids_are_the_end_of_text",
           f"tokenizer eos/bos, config bos/eos, generation bos/eos = {got}, want {eot}")


if __name__ == "__main__":
    mode, a = sys.argv[1], sys.argv[2:]
    if mode == "dtype":
        check_dtype(*a[:4])
    elif mode == "shards":
        check_shards(a[0], a[1], a[2], int(a[3]))
    else:
        check_transformers(a[0], a[1], a[2], int(a[3]), a[4:])
