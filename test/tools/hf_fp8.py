#!/usr/bin/env python3
"""Block-quantizes a Hugging Face model directory to FP8 the way DeepSeek-V3's release is, with
torch, and writes the dequantized reference the import must equal.

  hf_fp8.py SRC OUT REF [--break KIND]

Every matrix ending in .weight but the embedding, lm_head and the routers (mlp.gate) becomes
torch.float8_e4m3fn with WEIGHT_scale_inv [ceil(rows/16), ceil(cols/8)] fp32 beside it: the
block's largest |value| / 448 (e4m3's largest), DeepSeek's scale; weight = fp8 * scale_inv.
Blocks of 16 x 8 (not square, not dividing every shape) so that a swapped or misaligned block
index shows. OUT/config.json gains quantization_config {quant_method fp8, fmt e4m3,
weight_block_size [16, 8]}. REF gets the same model in fp32 with each quantized weight
fp8.float() * scale (one fp32 product, as the import computes it). --break makes OUT bad:
missing-scale (one scale tensor dropped), scale-shape (one block row short), scale-inf (one scale
infinite), no-config (no quantization_config)."""
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

B0, B1 = 16, 8


def quantize(t):
    R, C = t.shape
    pad = torch.zeros(math.ceil(R / B0) * B0, math.ceil(C / B1) * B1)
    pad[:R, :C] = t
    amax = pad.view(pad.shape[0] // B0, B0, pad.shape[1] // B1, B1).abs().amax(dim=(1, 3))
    scale = (amax / 448.0).clamp(min=1e-12).float()
    full = scale.repeat_interleave(B0, 0).repeat_interleave(B1, 1)[:R, :C]
    w8 = (t / full).to(torch.float8_e4m3fn)
    return w8, scale.contiguous(), w8.float() * full


def main():
    src, out, ref = sys.argv[1:4]
    brk = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--break" else None
    sd = load_file(f"{src}/model.safetensors")
    q, r = {}, {}
    for n, t in sd.items():
        if (t.ndim == 2 and n.endswith(".weight") and "embed_tokens" not in n
                and "lm_head" not in n and ".mlp.gate." not in n):
            q[n], q[n + "_scale_inv"], r[n] = quantize(t.float())
        else:
            q[n] = r[n] = t
    victim = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"  # 7 block rows
    if brk == "missing-scale":
        del q[victim]
    elif brk == "scale-shape":
        q[victim] = q[victim][:-1].contiguous()
    elif brk == "scale-inf":
        q[victim][2, 1] = float("inf")
    cfg = json.load(open(f"{src}/config.json"))
    for d in (out, ref):
        os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(f"{ref}/config.json", "w"), indent=2)
    if brk != "no-config":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [B0, B1]}
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)
    save_file(q, f"{out}/model.safetensors", metadata={"format": "pt"})
    save_file({n: t.float().contiguous() for n, t in r.items()}, f"{ref}/model.safetensors",
              metadata={"format": "pt"})


if __name__ == "__main__":
    main()
