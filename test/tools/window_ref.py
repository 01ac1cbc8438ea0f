#!/usr/bin/env python3
"""A llama forward in torch with one sliding window per layer (model.sliding_window as a list of
different sizes), independently of the C code, from a ustrain checkpoint's model.safetensors.

  window_ref.py loss TAG STEP_DIR HEADS WINDOWS VAL_SHARD NWIN T EXPECTED
      HEADS: n_head,n_kv_head,vocab_size[,rot] (rot: model.partial_rotary_factor's rotated
      features of a head, the first rot as pairs (i, i + rot/2); default all); WINDOWS: one per layer, comma-separated (0: full). The mean cross-entropy over
      the first NWIN windows of T+1 tokens of the llm.c shard against ustrain's val_loss at the
      same weights, within 1e-5 relative.
  window_ref.py logits TAG STEP_DIR HEADS WINDOWS PROMPT_IDS LOGITS_FILE
      LOGITS_FILE: `ustrain generate --dump-logits` rows (fp32, real vocabulary), one per new
      token; the greedy tokens they pick are appended to PROMPT_IDS and every row is compared
      with the reference's logits at that position (within 1e-4 of the logits' scale).
The model: RMSNorm (eps 1e-5), RoPE rotate-half (theta 10000), grouped-query attention where
query i sees key j when i - W < j <= i, SwiGLU, untied head; widths from the tensors."""
import sys

import numpy as np
import torch
from safetensors.numpy import load_file




def forward(w, H, Hkv, V, windows, x, rot=0):
    """logits (B, T, V) of tokens x (B, T)."""
    def rms(h, g):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * g
    B, T = x.shape
    h = w["model.embed_tokens.weight"][x]
    C = h.shape[-1]
    D = C // H
    R = rot or D
    inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()

    def rope(t):  # (B, heads, T, D): the first R features rotate, the rest pass
        r, rest = t[..., :R], t[..., R:]
        t1, t2 = r[..., : R // 2], r[..., R // 2 :]
        return torch.cat([r * cos + torch.cat([-t2, t1], -1) * sin, rest], -1)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    for l, W in enumerate(windows):
        p = f"model.layers.{l}."
        a = rms(h, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // Hkv, 1)
        v = v.repeat_interleave(H // Hkv, 1)
        ok = (j <= i) & ((j > i - W) if W else True)
        s = (q @ k.transpose(-1, -2)) / D ** 0.5
        s = s.masked_fill(~ok, float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        a = rms(h, w[p + "post_attention_layernorm.weight"])
        g = a @ w[p + "mlp.gate_proj.weight"].T
        u = a @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    h = rms(h, w["model.norm.weight"])
    return h @ w["lm_head.weight"][:V].T


def main():
    mode, tag, step, heads, wins = sys.argv[1:6]
    windows = [int(x) for x in wins.split(",")]
    w = {k: torch.tensor(v) for k, v in load_file(f"{step}/model.safetensors").items()}
    H, Hkv, V, rot = ([int(x) for x in heads.split(",")] + [0])[:4]
    torch.set_grad_enabled(False)
    if mode == "loss":
        shard, nwin, T, expected = sys.argv[6], int(sys.argv[7]), int(sys.argv[8]), float(sys.argv[9])
        hdr = np.fromfile(shard, dtype=np.int32, count=256)
        dt = np.uint16 if hdr[0] == 20240520 else np.uint32
        tok = np.fromfile(shard, dtype=dt, offset=1024).astype(np.int64)
        x = torch.tensor(np.stack([tok[n * T : n * T + T + 1] for n in range(nwin)]))
        logits = forward(w, H, Hkv, V, windows, x[:, :-1], rot)
        loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)))
        ok = abs(loss - expected) <= 1e-5 * abs(expected)
        print(f"PASS {tag}" if ok else f"FAIL {tag}: reference {loss:.7f} vs ustrain {expected:.7f}")
        print(f"  {tag}: reference loss {loss:.7f}, ustrain {expected:.7f}, |diff| {abs(loss - expected):.2e}")
        return
    ids = [int(t) for t in sys.argv[6].split(",")]
    rows = np.fromfile(sys.argv[7], dtype=np.float32).reshape(-1, V)
    seq = ids + [int(r.argmax()) for r in rows]
    ref = forward(w, H, Hkv, V, windows, torch.tensor([seq[:-1]]), rot)[0, len(ids) - 1 :].numpy()
    err = float(np.abs(ref - rows).max() / np.abs(ref).max())
    print(f"PASS {tag}" if err <= 1e-4 else f"FAIL {tag}: logits differ by {err:.2e} of their scale")
    print(f"  {tag}: {len(rows)} tokens, largest logit difference {err:.2e} of the scale")


if __name__ == "__main__":
    main()
