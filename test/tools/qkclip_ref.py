#!/usr/bin/env python3
"""QK-clip (Kimi K2's MuonClip) written from its definition in numpy, checked against ustrain's
checkpoints (test/sh/qkclip.sh).

  qkclip_ref.py tau STEP_DIR SHARD SAMPLE0 COUNT
      prints the median over (layer, query head) of the largest pre-softmax logit of the
      forwards of samples [SAMPLE0, SAMPLE0 + COUNT) with STEP_DIR's weights: a threshold that
      clips about half the heads.
  qkclip_ref.py check STEP_DIR SHARD SAMPLE0 COUNT TAU PLAIN_NEXT CLIPPED_NEXT METRICS
      PLAIN_NEXT and CLIPPED_NEXT are the next step's checkpoints of the same update without and
      with the clip at TAU. The reference's logits, from STEP_DIR's weights and the step's samples,
      give eta_h = min(1, TAU / max_h); query head h's q rows and bias must be PLAIN's times
      sqrt(eta_h), key/value head g's k rows and bias PLAIN's times sqrt(min of eta over the query
      heads that share g), every other tensor PLAIN's bit for bit; METRICS' last max_logit must
      be the reference's largest logit and qk_clipped_heads its count of heads above TAU.
  qkclip_ref.py stats STEP_DIR SHARD SAMPLE0 COUNT METRICS STEP
      logging.stats_every's telemetry of metrics line STEP, whose forwards are those of samples
      [SAMPLE0, SAMPLE0 + COUNT) with STEP_DIR's weights: layer_act_rms[l] must be the RMS of
      layer l's output (the residual stream after the block) over every token, layer_max_logit[l]
      layer l's largest logit, max_logit the largest of all (QK-clip off).

A sample i is the window of T + 1 tokens at token i * T of the (first) llm.c shard. Prints
PASS/FAIL lines."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from generate_check import linear, load_model, mlp, moe, norm, rope, rope_inv_freq  # noqa: E402


def samples(shard, s0, count, T):
    hdr = np.fromfile(shard, dtype=np.int32, count=256)
    toks = np.fromfile(shard, dtype=np.uint16, offset=1024, count=int(hdr[2])).astype(np.int64)
    return [toks[i * T:i * T + T] for i in range(s0, s0 + count)]


def max_logits(cfg, w, ids, out, sq=None):
    """out[l, h] = max(out[l, h], the largest causal logit of query head h in layer l); sq[l] +=
    the sum of squares of layer l's output, when given."""
    m = cfg["model"]
    llama = m["arch"] == "llama"
    T, H, Hkv = len(ids), m["n_head"], m["n_kv_head"]
    D = m["d_model"] // H
    inv = rope_inv_freq(m, D)
    x = w["model.embed_tokens.weight"][ids]
    if not llama:
        x = x + w["model.embed_positions.weight"][:T]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(m["n_layer"]):
        p = f"model.layers.{l}"
        h = norm(x, w, p + ".input_layernorm", llama, float(m["norm_eps"]))
        a = p + ".self_attn"
        q = linear(h, w, a + ".q_proj").reshape(T, H, D)
        k = linear(h, w, a + ".k_proj").reshape(T, Hkv, D)
        v = linear(h, w, a + ".v_proj").reshape(T, Hkv, D)
        if llama:
            pos = np.arange(T, dtype=np.float64)
            q, k = rope(q, pos, inv), rope(k, pos, inv)
        att = np.zeros((T, H, D))
        for hh in range(H):
            g = hh // (H // Hkv)
            s = np.where(mask, q[:, hh] @ k[:, g].T / np.sqrt(D), -np.inf)
            out[l, hh] = max(out[l, hh], s.max())
            e = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (e / e.sum(-1, keepdims=True)) @ v[:, g]
        x = x + linear(att.reshape(T, H * D), w, a + ".o_proj")
        h = norm(x, w, p + ".post_attention_layernorm", llama, float(m["norm_eps"]))
        is_moe = m["moe"]["num_experts"] > 0 and l % max(m["moe"]["every"], 1) == 0
        x = x + (moe(h, w, p + ".mlp", m, llama) if is_moe else mlp(h, w, p + ".mlp", llama))
        if sq is not None:
            sq[l] += (x * x).sum()


def table(step, shard, s0, count):
    cfg, w = load_model(step)
    m = cfg["model"]
    out = np.full((m["n_layer"], m["n_head"]), -np.inf)
    for ids in samples(shard, s0, count, cfg["train"]["seq_len"]):
        max_logits(cfg, w, ids, out)
    return cfg, out


def check(a):
    step, shard, s0, count, tau, plain, clipped, metrics = a
    cfg, mx = table(step, shard, int(s0), int(count))
    tau = float(tau)
    from safetensors.numpy import load_file
    P, C = load_file(f"{plain}/model.safetensors"), load_file(f"{clipped}/model.safetensors")
    m = cfg["model"]
    H, Hkv = m["n_head"], m["n_kv_head"]
    D, G = m["d_model"] // H, H // Hkv
    eta = np.minimum(1.0, tau / mx)
    bad = []
    for name in P:
        want = P[name].astype(np.float64)
        parts = name.split(".")
        if len(parts) > 4 and parts[3] == "self_attn" and parts[4] in ("q_proj", "k_proj"):
            e = eta[int(parts[2])]
            f = np.sqrt(e) if parts[4] == "q_proj" else np.sqrt(e.reshape(Hkv, G).min(1))
            want = want * np.repeat(f, D).reshape((-1,) + (1,) * (want.ndim - 1))
            err = np.abs(C[name] - want).max() / (np.abs(want).max() + 1e-30)
            # fp32 weights times fp32 factors from fp32 logits (ours float64): ~1e-6 relative
            if err > 2e-6:
                bad.append(f"{name}: {err:.3g} relative")
        elif not np.array_equal(P[name], C[name]):
            bad.append(f"{name}: changed, but QK-clip touches only q/k")
    rec = [json.loads(x) for x in open(metrics)][-1]
    if abs(rec["max_logit"] - mx.max()) > 1e-5 * abs(mx.max()):
        bad.append(f"max_logit {rec['max_logit']} but the reference's {mx.max()}")
    n = int((mx > tau).sum())
    if rec["qk_clipped_heads"] != n:
        bad.append(f"qk_clipped_heads {rec['qk_clipped_heads']} but {n} heads exceed {tau}")
    if not 0 < n < mx.size:
        bad.append(f"{n} of {mx.size} heads above the threshold: the case does not discriminate")
    print("FAIL " + "; ".join(bad[:4]) if bad else f"PASS ({n} of {mx.size} heads clipped)")
    return not bad


def stats(a):
    step, shard, s0, count, metrics, at = a
    cfg, w = load_model(step)
    m = cfg["model"]
    T, L = cfg["train"]["seq_len"], m["n_layer"]
    mx, sq = np.full((L, m["n_head"]), -np.inf), np.zeros(L)
    for ids in samples(shard, int(s0), int(count), T):
        max_logits(cfg, w, ids, mx, sq)
    rms = np.sqrt(sq / (int(count) * T * m["d_model"]))
    rec = [r for r in map(json.loads, open(metrics)) if r["step"] == int(at)][0]
    bad, worst = [], 0.0
    # fp32 forwards against float64: ~1e-6 relative; 1e-4 leaves room, a wrong layer or a
    # missing micro-batch moves these by percents
    for key, want in (("layer_act_rms", rms), ("layer_max_logit", mx.max(1))):
        got = np.array(rec.get(key, []), dtype=np.float64)
        if got.shape != want.shape:
            bad.append(f"{key} {rec.get(key)}: want {L} layers {want}")
            continue
        err = float(np.abs(got - want).max() / np.abs(want).max())
        worst = max(worst, err)
        if err > 1e-4:
            bad.append(f"{key} {got} but the reference's {want}")
    if abs(rec.get("max_logit", np.nan) - mx.max()) > 1e-4 * abs(mx.max()):
        bad.append(f"max_logit {rec.get('max_logit')} but the reference's {mx.max()}")
    print("FAIL " + "; ".join(bad[:3]) if bad else f"PASS ({worst:.2g} relative)")
    return not bad


def main():
    if sys.argv[1] == "stats":
        return 0 if stats(sys.argv[2:]) else 1
    if sys.argv[1] == "tau":
        _, mx = table(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        print(f"{np.median(mx):.9g}")
        return 0
    return 0 if check(sys.argv[2:]) else 1


if __name__ == "__main__":
    sys.exit(main())
