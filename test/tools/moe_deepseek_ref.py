#!/usr/bin/env python3
"""DeepSeek-V3's routing in ustrain against transformers' own DeepseekV3MoE / DeepseekV3TopkRouter
on the same weights. Prints PASS/FAIL lines (test/lib.sh style).

  moe_deepseek_ref.py TAG STEP_DIR MODEL_JSON VAL_SHARD NWIN T EXPECTED_LOSS [REL_TOL]

STEP_DIR is a ustrain checkpoint of a llama with per-head q/k norms (Qwen3's attention, which
hf_families.sh checks against transformers) whose MoE layers route as DeepSeek-V3 does (sigmoid
scores, the balancing bias router.expert_bias for the choice only, n_group / topk_group, the
routed scale, renormalized gates, a shared expert of n_shared * d_ff_expert). The reference is
transformers' Qwen3MoeForCausalLM with each MoE layer's block replaced by transformers'
DeepseekV3MoE (its router's e_score_correction_bias = ustrain's expert_bias), loaded with the
checkpoint's tensors; its mean cross-entropy over the first NWIN windows of T+1 tokens of the
llm.c shard must equal ustrain's val_loss (relative REL_TOL, default 1e-5). MODEL_JSON: n_layer,
d_model, n_head, n_kv_head, d_ff, vocab_size, experts, top_k, d_ff_expert, n_shared, n_group,
topk_group, routed_scale, first_dense, norm_eps, rope_theta, max_seq_len."""
import json
import sys

import numpy as np
import safetensors.numpy
import torch
import transformers as tf


def build(m):
    C, H = m["d_model"], m["n_head"]
    q = tf.Qwen3MoeConfig(
        hidden_size=C, intermediate_size=m["d_ff"], moe_intermediate_size=m["d_ff_expert"],
        num_hidden_layers=m["n_layer"], num_attention_heads=H, num_key_value_heads=m["n_kv_head"],
        head_dim=C // H, vocab_size=m["vocab_size"], num_experts=m["experts"],
        num_experts_per_tok=m["top_k"], decoder_sparse_step=1,
        mlp_only_layers=list(range(m["first_dense"])), rms_norm_eps=m["norm_eps"],
        rope_theta=m["rope_theta"], max_position_embeddings=m["max_seq_len"],
        tie_word_embeddings=False)
    model = tf.Qwen3MoeForCausalLM(q)
    d = tf.DeepseekV3Config(
        hidden_size=C, n_routed_experts=m["experts"], num_experts_per_tok=m["top_k"],
        moe_intermediate_size=m["d_ff_expert"], n_shared_experts=m["n_shared"],
        n_group=m["n_group"], topk_group=m["topk_group"],
        routed_scaling_factor=m["routed_scale"], norm_topk_prob=True, hidden_act="silu")
    for l in range(m["first_dense"], m["n_layer"]):
        model.model.layers[l].mlp = tf.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE(d)
    return model


def load(model, m, ck):
    V, E = m["vocab_size"], m["experts"]
    sd = {}
    for n, v in ck.items():
        t = torch.from_numpy(np.ascontiguousarray(v))
        if n in ("model.embed_tokens.weight", "lm_head.weight"):
            t = t[:V]  # the padded vocabulary's extra rows
        n = n.replace(".mlp.router.weight", ".mlp.gate.weight")
        n = n.replace(".mlp.router.expert_bias", ".mlp.gate.e_score_correction_bias")
        n = n.replace(".mlp.shared_expert.", ".mlp.shared_experts.")
        if ".mlp.experts." not in n:
            sd[n] = t
    for l in range(m["first_dense"], m["n_layer"]):
        p = f"model.layers.{l}.mlp.experts."
        g = [torch.from_numpy(np.ascontiguousarray(ck[f"{p}{e}.gate_proj.weight"])) for e in range(E)]
        u = [torch.from_numpy(np.ascontiguousarray(ck[f"{p}{e}.up_proj.weight"])) for e in range(E)]
        dn = [torch.from_numpy(np.ascontiguousarray(ck[f"{p}{e}.down_proj.weight"])) for e in range(E)]
        sd[p + "gate_up_proj"] = torch.stack([torch.cat([g[e], u[e]], 0) for e in range(E)])
        sd[p + "down_proj"] = torch.stack(dn)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    return [k for k in missing if "rotary" not in k], unexpected


def main():
    tag, step, mj, shard, nwin, T, expected = sys.argv[1:8]
    rel = float(sys.argv[8]) if len(sys.argv) > 8 else 1e-5
    nwin, T, expected = int(nwin), int(T), float(expected)
    m = json.load(open(mj))
    ck = safetensors.numpy.load_file(step + "/model.safetensors")
    model = build(m)
    missing, unexpected = load(model, m, ck)
    ok = not missing and not unexpected
    print(f"PASS {tag}_every_tensor_placed" if ok else
          f"FAIL {tag}_every_tensor_placed: missing {missing[:4]}, unexpected {unexpected[:4]}")
    bias = ck[f"model.layers.{m['first_dense']}.mlp.router.expert_bias"]
    print(f"PASS {tag}_bias_moved" if np.abs(bias).max() > 0 else
          f"FAIL {tag}_bias_moved: the balancing bias is still 0, so the test would not see it")
    model.eval()
    hdr = np.fromfile(shard, dtype=np.int32, count=256)
    dt = np.uint16 if hdr[0] == 20240520 else np.uint32
    tok = np.fromfile(shard, dtype=dt, offset=1024).astype(np.int64)
    x = torch.tensor(np.stack([tok[i * T: i * T + T + 1] for i in range(nwin)]))
    with torch.no_grad():
        logits = model(x[:, :-1]).logits
    loss = float(torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)))
    ok = abs(loss - expected) <= rel * abs(expected)
    print(f"PASS {tag}_loss_matches_transformers_deepseek_v3_moe" if ok else
          f"FAIL {tag}_loss_matches_transformers_deepseek_v3_moe: transformers {loss:.7f} vs "
          f"ustrain {expected:.7f}")
    print(f"  {tag}: DeepseekV3MoE loss {loss:.7f}, ustrain {expected:.7f}, "
          f"|diff| {abs(loss - expected):.2e}")


if __name__ == "__main__":
    main()
