#!/usr/bin/env python3
"""DeepSeek-V3's multi-token prediction written from the paper's equations (arXiv 2412.19437,
section 2.2) in torch, against ustrain's validation losses. Prints PASS/FAIL lines (test/lib.sh).

  mtp_ref.py TAG STEP_DIR MODEL_JSON VAL_SHARD NWIN T VAL_LOSS MTP_LOSSES [REL_TOL]

STEP_DIR: a ustrain checkpoint of a llama with model.mtp.depth D; MODEL_JSON: n_layer, d_model,
n_head, n_kv_head, vocab_size, norm_eps, rope_theta, depth, and for MoE layers top_k, n_group,
topk_group, routed_scale. The main model (a plain llama: RMSNorm, rotate-half RoPE, causal
grouped-query attention, SwiGLU; a layer with a router is DeepSeek-V3's MoE, moe() below) over the
first NWIN windows of T + 1 tokens of the llm.c shard must give VAL_LOSS; module k (1..D) at
position i:
  h'_i = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]   (enorm, hnorm; eh_proj = M_k, the
         embedding's half first, as DeepSeek's checkpoints lay it out)
  h^k = TRM_k(h'),  P^k_{i+k+1} = softmax(lm_head(RMSNorm(h^k_i)))   (shared_head.norm)
with h^0 the main model's last hidden state before its final norm, and its loss
  L^k = -1/T sum_{i=2+k}^{T+1} log P^k_i[t_i]   (the main model's token count T)
must give each of MTP_LOSSES (comma-separated), relative REL_TOL (default 1e-5).

  mtp_ref.py hf TAG HF_DIR VAL_SHARD NWIN T VAL_LOSS MTP_LOSSES [REL_TOL]

The same equations over a DeepseekV3ForCausalLM directory whose files carry DeepSeek's MTP layers
(model.layers.{L + k - 1}; config num_nextn_predict_layers): the main model and TRM_k are
transformers' own (DeepseekV3ForCausalLM, DeepseekV3DecoderLayer: latent attention; TRM_k a MoE
layer, DeepseekV3MoE, when the model has MoE layers, as DeepSeek-V3's), h^0 the input
of its final norm; Emb and lm_head are the main model's (the layers' copies must equal them)."""
import json
import sys

import numpy as np
import safetensors.numpy
import torch

F = torch.nn.functional


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """x (B, T, H, D) rotated at positions 0..T-1, pairs (j, j + D/2)."""
    T, D = x.shape[1], x.shape[3]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()[None, :, None, :]
    rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def swiglu(w, p, h):
    return (F.silu(h @ w[p + "gate_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T)) @ \
        w[p + "down_proj.weight"].T


def moe(w, p, h, m):
    """DeepSeek-V3's MoE (the paper's section 2.1.2): s = sigmoid(h W_r^T); the bias b (ustrain's
    router.expert_bias) joins the scores for the choice only: the topk_group groups of the highest
    sums of their 2 best s + b, then the top_k experts of s + b within them; gates s normalised
    over the k and times routed_scale; plus the shared expert."""
    E = w[p + "router.weight"].shape[0]
    s = torch.sigmoid(h @ w[p + "router.weight"].T)
    c = s + w[p + "router.expert_bias"]
    G = m["n_group"]
    g = c.view(*c.shape[:-1], G, E // G).topk(min(2, E // G), -1)[0].sum(-1)
    keep = torch.zeros_like(g).scatter(-1, g.topk(m["topk_group"], -1)[1], 1.0)
    c = c.masked_fill(keep.repeat_interleave(E // G, -1) == 0, float("-inf"))
    idx = c.topk(m["top_k"], -1)[1]
    gate = s.gather(-1, idx)
    gate = gate / gate.sum(-1, keepdim=True) * m["routed_scale"]
    y = torch.zeros_like(h)
    for e in range(E):
        sel = (idx == e)
        wt = (gate * sel).sum(-1, keepdim=True)
        if sel.any():
            y = y + wt * swiglu(w, f"{p}experts.{e}.", h)
    if p + "shared_expert.gate_proj.weight" in w:
        y = y + swiglu(w, p + "shared_expert.", h)
    return y


def block(w, l, x, m):
    p, eps = f"model.layers.{l}.", m["norm_eps"]
    B, T, C = x.shape
    H, Hkv = m["n_head"], m["n_kv_head"]
    D = C // H
    h = rms(x, w[p + "input_layernorm.weight"], eps)
    q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D), m["rope_theta"])
    k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D), m["rope_theta"])
    v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D)
    k, v = k.repeat_interleave(H // Hkv, 2), v.repeat_interleave(H // Hkv, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / D ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    a = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v).reshape(B, T, C)
    x = x + a @ w[p + "self_attn.o_proj.weight"].T
    h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
    return x + (moe(w, p + "mlp.", h, m) if p + "mlp.router.weight" in w else swiglu(w, p + "mlp.", h))


def losses(w, m, tok):
    """tok (B, T+1): the main mean loss and each module's L^k."""
    V, L, eps = m["vocab_size"], m["n_layer"], m["norm_eps"]
    E = w["model.embed_tokens.weight"][:V]
    lm = w.get("lm_head.weight", w["model.embed_tokens.weight"])[:V]
    B, T = tok.shape[0], tok.shape[1] - 1
    h = E[tok[:, :T]]
    for l in range(L):
        h = block(w, l, h, m)
    main = F.cross_entropy((rms(h, w["model.norm.weight"], eps) @ lm.T).reshape(-1, V),
                           tok[:, 1:].reshape(-1))
    out = []
    for k in range(1, m["depth"] + 1):
        n, p = T - k, f"model.layers.{L + k - 1}."  # positions i = 1..T-k predict t_{i+k+1}
        e = rms(E[tok[:, k:k + n]], w[p + "enorm.weight"], eps)
        hp = rms(h[:, :n], w[p + "hnorm.weight"], eps)
        h = block(w, L + k - 1, torch.cat([e, hp], -1) @ w[p + "eh_proj.weight"].T, m)
        logits = rms(h, w[p + "shared_head.norm.weight"], eps) @ lm.T
        ce = F.cross_entropy(logits.reshape(-1, V), tok[:, k + 1:k + 1 + n].reshape(-1),
                             reduction="sum")
        out.append(float(ce) / (B * T))
    return float(main), out


def hf_losses(d, tok):
    """losses() over Hugging Face directory d with transformers' main model and blocks."""
    import transformers as tf
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
    c = json.load(open(d + "/config.json"))  # the MTP layers: as transformers ignores layer 61
    tf.DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected = [
        rf"model\.layers\.{c['num_hidden_layers'] + k}\..*"
        for k in range(c["num_nextn_predict_layers"])]
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                    attn_implementation="eager").eval()
    cfg = model.config
    L, D, eps, V = cfg.num_hidden_layers, cfg.num_nextn_predict_layers, cfg.rms_norm_eps, cfg.vocab_size
    w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
         safetensors.numpy.load_file(d + "/model.safetensors").items()}
    E, lm = w["model.embed_tokens.weight"], w.get("lm_head.weight", w["model.embed_tokens.weight"])
    B, T = tok.shape[0], tok.shape[1] - 1
    got = {}
    model.model.norm.register_forward_pre_hook(lambda mod, a: got.update(h=a[0]))
    logits = model(tok[:, :T]).logits
    main = F.cross_entropy(logits.reshape(-1, V), tok[:, 1:].reshape(-1))
    h, out = got["h"], []
    for k in range(1, D + 1):
        n, p = T - k, f"model.layers.{L + k - 1}."
        ok = all(torch.equal(w[p + a], w[b]) for a, b in
                 (("embed_tokens.weight", "model.embed_tokens.weight"),
                  ("shared_head.head.weight", "lm_head.weight")))
        print(f"PASS hf_mtp_layer_{k}_copies_equal_main" if ok else
              f"FAIL hf_mtp_layer_{k}_copies_equal_main: embed_tokens or shared_head.head differs")
        e = rms(E[tok[:, k:k + n]], w[p + "enorm.weight"], eps)
        hp = rms(h[:, :n], w[p + "hnorm.weight"], eps)
        x = torch.cat([e, hp], -1) @ w[p + "eh_proj.weight"].T
        moe = cfg.first_k_dense_replace < L  # a MoE layer past first_k_dense_replace, as V3's
        blk = DeepseekV3DecoderLayer(cfg, L + k - 1 if moe else 0).eval()
        sd = {a[len(p):]: v for a, v in w.items() if a.startswith(p) and
              a[len(p):].startswith(("input_", "self_attn.", "post_attention_", "mlp."))}
        if "mlp.experts.gate_up_proj" in blk.state_dict():  # the file's experts, fused
            E = cfg.n_routed_experts
            x_ = [sd.pop(f"mlp.experts.{e}.{a}_proj.weight") for a in ("gate", "up", "down")
                  for e in range(E)]
            sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([x_[e], x_[E + e]], 0)
                                                          for e in range(E)])
            sd["mlp.experts.down_proj"] = torch.stack(x_[2 * E:])
        blk.load_state_dict(sd)
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        h = blk(x, attention_mask=mask, position_ids=pos,
                position_embeddings=model.model.rotary_emb(x, pos))
        lg = rms(h, w[p + "shared_head.norm.weight"], eps) @ lm.T
        ce = F.cross_entropy(lg.reshape(-1, V), tok[:, k + 1:k + 1 + n].reshape(-1), reduction="sum")
        out.append(float(ce) / (B * T))
    return float(main), out


def main():
    hf = sys.argv[1] == "hf"
    if hf:
        del sys.argv[1]
    tag, step, mj, shard, nwin, T, vl, ml = (sys.argv[1:3] + [None] + sys.argv[3:8] if hf else
                                             sys.argv[1:9])
    rel = float(sys.argv[9 - hf]) if len(sys.argv) > 9 - hf else 1e-5
    nwin, T, vl = int(nwin), int(T), float(vl)
    ml = [float(x) for x in ml.split(",") if x]
    hdr = np.fromfile(shard, dtype=np.int32, count=256)
    dt = np.uint16 if hdr[0] == 20240520 else np.uint32
    t = np.fromfile(shard, dtype=dt, offset=1024).astype(np.int64)
    tok = torch.tensor(np.stack([t[i * T: i * T + T + 1] for i in range(nwin)]))
    with torch.no_grad():
        if hf:
            got, mtp = hf_losses(step, tok)
            m = {"depth": len(mtp)}
        else:
            m = json.load(open(mj))
            w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
                 safetensors.numpy.load_file(step + "/model.safetensors").items()}
            got, mtp = losses(w, m, tok)
    ok = abs(got - vl) <= rel * abs(vl)
    print(f"PASS {tag}_main_loss_matches_reference" if ok else
          f"FAIL {tag}_main_loss_matches_reference: reference {got:.7f} vs ustrain {vl:.7f}")
    ok = len(ml) == m["depth"] and all(abs(a - b) <= rel * abs(b) for a, b in zip(mtp, ml))
    print(f"PASS {tag}_mtp_losses_match_paper_reference" if ok else
          f"FAIL {tag}_mtp_losses_match_paper_reference: reference {mtp} vs ustrain {ml}")
    print(f"  {tag}: main {got:.7f} (ustrain {vl:.7f}); modules {['%.7f' % x for x in mtp]} "
          f"(ustrain {['%.7f' % x for x in ml]})")


if __name__ == "__main__":
    main()
