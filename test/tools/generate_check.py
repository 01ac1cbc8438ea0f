#!/usr/bin/env python3
"""Independent checks of `ustrain generate` (test/sh/generate.sh).

  generate_check.py reference NAME STEP_DIR PROMPT_IDS DUMP
      A numpy (float64) forward of the checkpoint's model without any cache, written from the
      model's definition (docs/design.md section 5, core/model/model.c, core/model/moe.c) rather than from
      core/model/infer.c: for every step i of ustrain's greedy run it recomputes the whole sequence
      prompt + the tokens ustrain picked before i and compares the last position's logits with
      the row ustrain dumped (--dump-logits), and the greedy pick. PROMPT_IDS: comma-separated.
  generate_check.py transformers NAME HF_DIR PROMPT_IDS DUMP
      transformers' generate(do_sample=False) on the exported model must pick the same tokens.

Prints PASS NAME / FAIL NAME: why."""
import json
import sys

import numpy as np


def load_dump(path, V):
    d = np.fromfile(path, dtype=np.float32)
    assert d.size % V == 0, f"{path}: {d.size} floats is not a multiple of V={V}"
    return d.reshape(-1, V)


def scalar(v):
    v = v.strip()
    if v.startswith('"'):
        return json.loads(v)
    if v in ("true", "false"):
        return v == "true"
    if v == "null":
        return None
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def parse_config(text):
    """The effective config as cfg_dump writes it: nested "key: value" lines, two spaces per
    level (no PyYAML needed, which CI may lack)."""
    root, stack = {}, [(-1, None)]
    stack[0] = (-1, root)
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        depth = len(line) - len(line.lstrip(" "))
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1]
        if value.strip() == "":
            parent[key] = {}
            stack.append((depth, parent[key]))
        else:
            parent[key] = scalar(value)
    return root


def load_model(step):
    from safetensors.numpy import load_file

    state = json.load(open(f"{step}/state.json"))
    cfg = parse_config(state["config"])
    w = {k: v.astype(np.float64) for k, v in load_file(f"{step}/model.safetensors").items()}
    return cfg, w


def rope_inv_freq(m, D):
    theta = float(m["rope_theta"])
    f = theta ** (-2.0 * np.arange(D // 2) / D)
    rs = m.get("rope_scaling") or {}
    if rs.get("type") != "llama3":
        return f
    # transformers' _compute_llama3_parameters
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    wavelen = 2 * np.pi / f
    s = (old / wavelen - lo) / (hi - lo)
    smooth = (1 - s) * f / factor + s * f
    return np.where(wavelen < old / hi, f, np.where(wavelen > old / lo, f / factor, smooth))


def rope(x, pos, inv):  # x (T, H, D), rotate-half pairs (i, i + D/2)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def norm(x, w, prefix, llama, eps):
    if llama:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w[prefix + ".weight"]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w[prefix + ".weight"] + w[prefix + ".bias"]


def linear(x, w, name):
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if name + ".bias" in w else y


def mlp(x, w, prefix, llama):
    if llama:
        g, u = linear(x, w, prefix + ".gate_proj"), linear(x, w, prefix + ".up_proj")
        return linear(g / (1 + np.exp(-g)) * u, w, prefix + ".down_proj")
    u = linear(x, w, prefix + ".up_proj")
    h = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    return linear(h, w, prefix + ".down_proj")


def moe(x, w, prefix, m, llama):
    E, k = m["moe"]["num_experts"], m["moe"]["top_k"]
    logits = x @ w[prefix + ".router.weight"].T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-p[t], kind="stable")[:k]  # descending, ties to the lower index
        gates = p[t, top] / p[t, top].sum()
        for g, e in zip(gates, top):
            y[t] += g * mlp(x[t:t + 1], w, f"{prefix}.experts.{e}", llama)[0]
    if m["moe"]["shared_expert"]:
        y += mlp(x, w, prefix + ".shared_expert", llama)
    assert E > 0
    return y


def attention(x, w, prefix, m, inv, llama):
    T, H, Hkv = x.shape[0], m["n_head"], m["n_kv_head"]
    D = m["d_model"] // H
    q = linear(x, w, prefix + ".q_proj").reshape(T, H, D)
    k = linear(x, w, prefix + ".k_proj").reshape(T, Hkv, D)
    v = linear(x, w, prefix + ".v_proj").reshape(T, Hkv, D)
    if llama:
        pos = np.arange(T, dtype=np.float64)
        q, k = rope(q, pos, inv), rope(k, pos, inv)
    out = np.zeros((T, H, D))
    mask = np.tril(np.ones((T, T), dtype=bool))
    for h in range(H):
        kv = h // (H // Hkv)
        s = q[:, h] @ k[:, kv].T / np.sqrt(D)
        s = np.where(mask, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
    return linear(out.reshape(T, H * D), w, prefix + ".o_proj")


def forward(cfg, w, ids):
    """Logits of the last position over the real vocabulary."""
    m = cfg["model"]
    llama = m["arch"] == "llama"
    eps = float(m["norm_eps"])
    D = m["d_model"] // m["n_head"]
    inv = rope_inv_freq(m, D)
    x = w["model.embed_tokens.weight"][ids]
    if not llama:
        x = x + w["model.embed_positions.weight"][: len(ids)]
    every = max(m["moe"]["every"], 1)
    for l in range(m["n_layer"]):
        p = f"model.layers.{l}"
        x = x + attention(norm(x, w, p + ".input_layernorm", llama, eps), w, p + ".self_attn", m, inv, llama)
        h = norm(x, w, p + ".post_attention_layernorm", llama, eps)
        is_moe = m["moe"]["num_experts"] > 0 and l % every == 0
        x = x + (moe(h, w, p + ".mlp", m, llama) if is_moe else mlp(h, w, p + ".mlp", llama))
    x = norm(x[-1:], w, "model.norm", llama, eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (x @ head[: m["vocab_size"]].T)[0]


def reference(name, step, prompt, dump):
    cfg, w = load_model(step)
    V = cfg["model"]["vocab_size"]
    rows = load_dump(dump, V)
    ids = [int(t) for t in prompt.split(",")]
    worst = 0.0
    for i, row in enumerate(rows):
        ref = forward(cfg, w, np.array(ids))
        # fp32 against float64: the logits' error grows with depth and magnitude; 1e-4 of the
        # logits' scale (plus 1e-4) is far below any difference a wrong formula makes
        tol = 1e-4 + 1e-4 * np.abs(ref).max()
        err = np.abs(row - ref).max()
        worst = max(worst, err / tol)
        if err > tol:
            print(f"FAIL {name}: step {i} (sequence of {len(ids)}): logits differ by {err:.3g} "
                  f"(tolerance {tol:.3g}); argmax ustrain {row.argmax()} reference {ref.argmax()}")
            return
        if int(ref.argmax()) != int(row.argmax()):
            print(f"FAIL {name}: step {i}: greedy picks {row.argmax()} but the reference {ref.argmax()}")
            return
        ids.append(int(row.argmax()))
    print(f"PASS {name}")
    print(f"  {len(rows)} steps, worst logits error {worst:.3f} of the tolerance")


def transformers_check(name, hf_dir, prompt, dump):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    V = model.config.vocab_size
    rows = load_dump(dump, V)
    ids = torch.tensor([[int(t) for t in prompt.split(",")]])
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=len(rows), min_new_tokens=len(rows),
                             pad_token_id=0, eos_token_id=None)
    theirs = out[0, ids.shape[1]:].tolist()
    ours = [int(r.argmax()) for r in rows]
    if theirs == ours:
        print(f"PASS {name}")
    else:
        print(f"FAIL {name}: transformers picked {theirs}, ustrain {ours}")


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"reference": reference, "transformers": transformers_check}[mode](*args)
