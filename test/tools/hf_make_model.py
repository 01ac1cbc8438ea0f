#!/usr/bin/env python3
"""Writes small Hugging Face model directories for the import tests with numpy only (no torch),
and compares an imported-then-exported directory with the original.

  hf_make_model.py make KIND OUT [--dtype f32|bf16|f16] [--shards N] [--seed S]
                   [--set KEY=JSON]... [--bad-shape TENSOR] [--bad-dtype TENSOR=DT]
      KIND: llama, llama_tied, llama3 (rope_scaling llama3), qwen2 (q/k/v biases), qwen3 (q/k head
      norms), mistral (a sliding window of 8 in every layer), qwen2_window (Qwen2 with a window
      of 8 on the layers from max_window_layers = 1 on), llama_yarn (rope_scaling yarn, factor 4
      over 16 original positions), olmo2 (q/k norms over the whole projections, norms after
      attention and the MLP), mixtral, qwen3_moe (decoder_sparse_step 2: layer 0 dense,
      layer 1 four experts), gemma3 (Gemma3ForCausalLM: 4 layers local, local, global, local
      with a window of 8, head_dim 24 apart from hidden_size / heads, query_pre_attn_scalar 20,
      global RoPE 1e6 with linear scaling 2, local 1e4, tied embeddings), gemma2
      (Gemma2ForCausalLM: Gemma 3's block without q/k norms, 4 layers local, global, local,
      global with a window of 8, one RoPE base, both soft-caps, GEMMA2), gpt2.
      Writes OUT/config.json and OUT/model.safetensors, or with --shards N > 1
      OUT/model-0000i-of-0000N.safetensors + model.safetensors.index.json. The safetensors files
      are written by hand (8-byte little-endian header length, JSON header padded to 8 bytes,
      data), so BF16 needs no torch: its values are float32 random numbers cut to their top 16
      bits. The vocabulary table starts with signed zero, F16 subnormals and its smallest normal. --set patches config.json (the bad-input cases), --bad-shape writes one tensor with
      an extra row, --bad-dtype gives one tensor another dtype label, --hub-names 1 writes GPT-2
      as the Hub's own files are (no "transformer." prefix, attn.bias / attn.masked_bias buffers).
  hf_make_model.py transformers KIND OUT
      transformers itself builds KIND (LlamaForCausalLM(LlamaConfig(...)), ...) with the same small
      shapes (KIND gemma3_softcap: gemma3 with Gemma 2's final_logit_softcapping, GEMMA3_CAPS,
      small enough to bend this model's logits; gemma2 with attn_implementation="eager", the
      path that applies attn_logit_softcapping), every weight redrawn (biases and norms too, so none is trivially zero or one), and
      save_pretrained writes OUT (needs torch and transformers).
  hf_make_model.py compare TAG ORIG_DIR EXPORTED_DIR
      Every tensor of ORIG_DIR is in EXPORTED_DIR (ustrain's fp32 export) with the same shape
      and bit-identical values after widening (BF16/F16 -> F32), and nothing else is; prints
      PASS/FAIL lines (test/lib.sh style)."""
import json
import os
import struct
import sys

import numpy as np

DIMS = dict(L=2, C=64, H=4, KV=2, F=96, V=300, T=64, E=4, K=2, FE=48)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0}


def llama_config(kind):
    d = DIMS
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen2_window": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
            "mixtral": "MixtralForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "olmo2": "Olmo2ForCausalLM"}.get(kind, "LlamaForCausalLM")
    cfg = {
        "architectures": [arch],
        "model_type": {"qwen2": "qwen2", "qwen2_window": "qwen2", "qwen3": "qwen3",
                       "mistral": "mistral", "mixtral": "mixtral",
                       "qwen3_moe": "qwen3_moe", "olmo2": "olmo2"}.get(kind, "llama"),
        "hidden_size": d["C"], "intermediate_size": d["FE"] if kind == "mixtral" else d["F"],
        "num_hidden_layers": d["L"], "num_attention_heads": d["H"], "num_key_value_heads": d["KV"],
        "vocab_size": d["V"], "max_position_embeddings": d["T"], "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0 if kind == "llama3" else 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": kind == "llama_tied", "rope_scaling": None,
        "torch_dtype": "float32",
    }
    if kind == "llama_yarn":
        cfg["rope_scaling"] = YARN
    if kind == "llama3":
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    if kind in ("qwen2", "qwen3"):
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=d["L"])
    if kind == "qwen3":
        cfg.update(attention_bias=False, head_dim=d["C"] // d["H"])
    if kind == "olmo2":
        cfg.update(attention_bias=False)
    if kind == "qwen2_window":
        cfg.update(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    if kind == "mistral":
        cfg.update(sliding_window=8, head_dim=d["C"] // d["H"])
    if kind == "mixtral":
        cfg.update(num_local_experts=d["E"], num_experts_per_tok=d["K"], sliding_window=None,
                   router_aux_loss_coef=0.001)
    if kind in ("llama", "llama_tied", "llama3", "llama_yarn"):
        cfg.update(attention_bias=False, mlp_bias=False, head_dim=d["C"] // d["H"])
    if kind == "qwen3_moe":
        cfg.update(attention_bias=False, head_dim=d["C"] // d["H"], moe_intermediate_size=d["FE"],
                   num_experts=d["E"], num_experts_per_tok=d["K"], decoder_sparse_step=2,
                   mlp_only_layers=[], norm_topk_prob=True, use_sliding_window=False,
                   sliding_window=None, router_aux_loss_coef=0.001)
    return cfg


def llama_tensors(kind):
    d = DIMS
    D = d["C"] // d["H"]
    HD, KVD = d["H"] * D, d["KV"] * D
    t = [("model.embed_tokens.weight", (d["V"], d["C"]))]
    for i in range(d["L"]):
        p = f"model.layers.{i}."
        t += [(p + ("post_feedforward_layernorm.weight" if kind == "olmo2"
                    else "input_layernorm.weight"), (d["C"],)),
              (p + "self_attn.q_proj.weight", (HD, d["C"])),
              (p + "self_attn.k_proj.weight", (KVD, d["C"])),
              (p + "self_attn.v_proj.weight", (KVD, d["C"])),
              (p + "self_attn.o_proj.weight", (d["C"], HD)),
              (p + "post_attention_layernorm.weight", (d["C"],))]
        if kind in ("qwen3", "qwen3_moe"):
            t += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
        if kind == "olmo2":
            t += [(p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (KVD,))]
        if kind in ("qwen2", "qwen2_window"):
            t += [(p + "self_attn.q_proj.bias", (HD,)), (p + "self_attn.k_proj.bias", (KVD,)),
                  (p + "self_attn.v_proj.bias", (KVD,))]
        if kind == "mixtral":
            t.append((p + "block_sparse_moe.gate.weight", (d["E"], d["C"])))
            for e in range(d["E"]):
                q = f"{p}block_sparse_moe.experts.{e}."
                t += [(q + "w1.weight", (d["FE"], d["C"])), (q + "w2.weight", (d["C"], d["FE"])),
                      (q + "w3.weight", (d["FE"], d["C"]))]
        elif kind == "qwen3_moe" and i % 2 == 1:  # decoder_sparse_step 2
            t.append((p + "mlp.gate.weight", (d["E"], d["C"])))
            for e in range(d["E"]):
                q = f"{p}mlp.experts.{e}."
                t += [(q + "gate_proj.weight", (d["FE"], d["C"])),
                      (q + "up_proj.weight", (d["FE"], d["C"])),
                      (q + "down_proj.weight", (d["C"], d["FE"]))]
        else:
            t += [(p + "mlp.gate_proj.weight", (d["F"], d["C"])),
                  (p + "mlp.up_proj.weight", (d["F"], d["C"])),
                  (p + "mlp.down_proj.weight", (d["C"], d["F"]))]
    t.append(("model.norm.weight", (d["C"],)))
    if kind != "llama_tied":
        t.append(("lm_head.weight", (d["V"], d["C"])))
    return t


GEMMA3 = dict(L=4, HD=24, QS=20, W=8,
              TYPES=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
              ROPE={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})


# Gemma 2's final soft-cap on the gemma3 model: its logits reach ~1.7, so a cap of 1.0 bends
# them (transformers' Gemma3 keeps attn_logit_softcapping in its config but never applies it).
GEMMA3_CAPS = dict(final_logit_softcapping=1.0)


def gemma3_config():
    d, g = DIMS, GEMMA3
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_size": d["C"], "intermediate_size": d["F"], "num_hidden_layers": g["L"],
            "num_attention_heads": d["H"], "num_key_value_heads": d["KV"], "head_dim": g["HD"],
            "vocab_size": d["V"], "max_position_embeddings": d["T"], "rms_norm_eps": 1e-6,
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": g["QS"],
            "sliding_window": g["W"], "layer_types": g["TYPES"], "rope_parameters": g["ROPE"],
            "final_logit_softcapping": None, "attn_logit_softcapping": None,
            "attention_bias": False, "tie_word_embeddings": True, "torch_dtype": "float32"}


# Gemma 2: the default layer_types (even layers local), both caps small enough to bend this
# model's attention scores (|s| up to ~0.4) and logits (~1.7)
GEMMA2 = dict(L=4, HD=24, QS=20, W=8, THETA=5e4, CAPS=dict(attn_logit_softcapping=0.15,
                                                          final_logit_softcapping=1.0))


def gemma2_config():
    d, g = DIMS, GEMMA2
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
            "hidden_size": d["C"], "intermediate_size": d["F"], "num_hidden_layers": g["L"],
            "num_attention_heads": d["H"], "num_key_value_heads": d["KV"], "head_dim": g["HD"],
            "vocab_size": d["V"], "max_position_embeddings": d["T"], "rms_norm_eps": 1e-6,
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": g["QS"],
            "sliding_window": g["W"], "rope_theta": g["THETA"], **g["CAPS"],
            "attention_bias": False, "tie_word_embeddings": True, "torch_dtype": "float32"}


def gemma3_tensors(qk_norm=True):
    d, g = DIMS, GEMMA3
    C, Q, KV = d["C"], d["H"] * g["HD"], d["KV"] * g["HD"]
    t = [("model.embed_tokens.weight", (d["V"], C))]
    for i in range(g["L"]):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (Q, C)),
              (p + "self_attn.k_proj.weight", (KV, C)), (p + "self_attn.v_proj.weight", (KV, C)),
              (p + "self_attn.o_proj.weight", (C, Q))]
        if qk_norm:
            t += [(p + "self_attn.q_norm.weight", (g["HD"],)),
                  (p + "self_attn.k_norm.weight", (g["HD"],))]
        t += [(p + "post_attention_layernorm.weight", (C,)),
              (p + "pre_feedforward_layernorm.weight", (C,)),
              (p + "post_feedforward_layernorm.weight", (C,)),
              (p + "mlp.gate_proj.weight", (d["F"], C)), (p + "mlp.up_proj.weight", (d["F"], C)),
              (p + "mlp.down_proj.weight", (C, d["F"]))]
    return t + [("model.norm.weight", (C,))]


def gpt2_config():
    d = DIMS
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": d["V"],
            "n_positions": d["T"], "n_ctx": d["T"], "n_embd": d["C"], "n_layer": d["L"],
            "n_head": d["H"], "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "tie_word_embeddings": True, "scale_attn_weights": True}


def gpt2_tensors():
    d = DIMS
    C, F = d["C"], 4 * d["C"]
    t = [("transformer.wte.weight", (d["V"], C)), ("transformer.wpe.weight", (d["T"], C))]
    for i in range(d["L"]):
        p = f"transformer.h.{i}."
        t += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
              (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
              (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
              (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
              (p + "mlp.c_fc.weight", (C, F)), (p + "mlp.c_fc.bias", (F,)),
              (p + "mlp.c_proj.weight", (F, C)), (p + "mlp.c_proj.bias", (C,))]
    t += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return t


def encode(values, dtype):
    """float32 values -> (safetensors dtype, bytes)."""
    if dtype == "bf16":
        return "BF16", (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    if dtype == "f16":
        return "F16", values.astype("<f2").tobytes()
    return "F32", values.astype("<f4").tobytes()


def write_safetensors(path, items):
    """items: [(name, dtype label, shape, bytes)] in order, data packed without gaps."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for item in items:
            f.write(item[3])


def make(kind, out, dtype="f32", shards=1, seed=1, sets=(), bad_shape=None, bad_dtype=None,
         hub_names=False):
    rng = np.random.default_rng(seed)
    cfg = (gpt2_config() if kind == "gpt2" else gemma3_config() if kind == "gemma3"
           else gemma2_config() if kind == "gemma2" else llama_config(kind))
    names = (gpt2_tensors() if kind == "gpt2" else gemma3_tensors() if kind == "gemma3"
             else gemma3_tensors(False) if kind == "gemma2" else llama_tensors(kind))
    for s in sets:
        k, v = s.split("=", 1)
        cfg[k] = json.loads(v)
    items = []
    for name, shape in names:
        if name == bad_shape:
            shape = (shape[0] + 1,) + tuple(shape[1:])
        norm = "norm" in name or "ln_" in name
        # (Gemma 3's norms scale by 1 + w: their weights are drawn around 0, as it stores them)
        one = 0 if kind.startswith("gemma") else 1
        vals = (one + 0.1 * rng.standard_normal(shape) if norm and name.endswith("weight")
                else 0.05 * rng.standard_normal(shape)).astype(np.float32)
        if name in ("model.embed_tokens.weight", "transformer.wte.weight"):
            # the edges of the narrow formats that keep the loss sane: signed zero, F16's
            # subnormals (smallest, and one with several mantissa bits) and its smallest normal
            vals.flat[:6] = [0.0, -0.0, 5.960464477539063e-08, -2.9802322387695312e-06,
                             -4.172325134277344e-07, 6.103515625e-05]
        dt, raw = encode(vals, dtype)
        if bad_dtype and bad_dtype.split("=")[0] == name:
            dt = bad_dtype.split("=")[1]
        items.append((name, dt, shape, raw))
    if hub_names:  # as the Hub's GPT-2 files: no "transformer." and the attention buffers
        items = [(it[0].replace("transformer.", "", 1),) + it[1:] for it in items]
        T = DIMS["T"]
        mask = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
        for i in range(DIMS["L"]):
            items.append((f"h.{i}.attn.bias", "F32", (1, 1, T, T), mask.tobytes()))
            items.append((f"h.{i}.attn.masked_bias", "F32", (), np.float32(-1e4).tobytes()))
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), items)
        return
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    per = [items[i::shards] for i in range(shards)]
    wm = {}
    for f, its in zip(files, per):
        write_safetensors(os.path.join(out, f), its)
        wm.update({it[0]: f for it in its})
    json.dump({"metadata": {"total_size": sum(len(i[3]) for i in items)}, "weight_map": wm},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)


def read_dir(d):
    """{name: float32 array} of every tensor in the directory's safetensors files."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        raw = open(os.path.join(d, f), "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            buf = data[b:end]
            if e["dtype"] == "BF16":
                a = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif e["dtype"] == "F16":
                a = np.frombuffer(buf, "<f2").astype(np.float32)
            else:
                a = np.frombuffer(buf, "<f4")
            out[name] = a.reshape(e["shape"])
    return out


def compare(tag, orig, exported):
    a, b = read_dir(orig), read_dir(exported)
    # Hub-style GPT-2 names (no "transformer.", attention buffers) stand for the exported ones
    a = {(n if n in b or "transformer." + n not in b else "transformer." + n): v
         for n, v in a.items() if not n.endswith((".attn.bias", ".attn.masked_bias"))}
    print(f"PASS {tag}_same_tensor_names" if set(a) == set(b) else
          f"FAIL {tag}_same_tensor_names: only in original {sorted(set(a) - set(b))[:3]}, "
          f"only in export {sorted(set(b) - set(a))[:3]}")
    bad = [n for n in a if n in b and (a[n].shape != b[n].shape or
                                       a[n].view(np.uint32).tobytes() != b[n].view(np.uint32).tobytes())]
    print(f"PASS {tag}_every_tensor_bit_identical" if not bad and a else
          f"FAIL {tag}_every_tensor_bit_identical: {len(bad)} differ, e.g. {bad[:3]}")


def make_with_transformers(kind, out, seed=1):
    import torch
    import transformers as tf
    d = DIMS
    torch.manual_seed(seed)
    common = dict(hidden_size=d["C"], num_hidden_layers=d["L"], num_attention_heads=d["H"],
                  num_key_value_heads=d["KV"], vocab_size=d["V"], max_position_embeddings=d["T"],
                  rms_norm_eps=1e-5, tie_word_embeddings=kind == "llama_tied")
    if kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=d["C"], n_layer=d["L"], n_head=d["H"], vocab_size=d["V"],
                            n_positions=d["T"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = tf.GPT2LMHeadModel(cfg)
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(intermediate_size=d["F"], **common))
    elif kind == "qwen2_window":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(intermediate_size=d["F"], use_sliding_window=True,
                                                   sliding_window=8, max_window_layers=1, **common))
    elif kind == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(intermediate_size=d["F"], sliding_window=8,
                                                       head_dim=d["C"] // d["H"], **common))
    elif kind == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(intermediate_size=d["F"],
                                                   head_dim=d["C"] // d["H"], **common))
    elif kind in ("deepseek_v3", "deepseek_v3_noq"):  # all layers dense: no DeepSeek routing
        model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            intermediate_size=d["F"], first_k_dense_replace=d["L"], num_nextn_predict_layers=0,
            q_lora_rank=24 if kind == "deepseek_v3" else None, kv_lora_rank=16,
            qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=16, rope_interleave=True,
            rope_parameters=dict(YARN, rope_theta=10000.0, mscale=1.0, mscale_all_dim=1.0)
            if kind == "deepseek_v3" else None,
            **dict(common, num_key_value_heads=d["H"])))
    elif kind in ("deepseek_v3_moe", "deepseek_v3_moe_mtp"):  # layer 0 dense, layer 1 DeepSeek
        # MoE: 8 experts in 4 groups; _mtp: one MTP layer, a MoE block (add_mtp_layers)
        model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            intermediate_size=d["F"], first_k_dense_replace=1,
            num_nextn_predict_layers=1 if kind.endswith("_mtp") else 0,
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=d["FE"] // 2,
            n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
            norm_topk_prob=True, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
            qk_rope_head_dim=8, v_head_dim=16, rope_interleave=True,
            rope_parameters=dict(YARN, rope_theta=10000.0, mscale=1.0, mscale_all_dim=1.0),
            **dict(common, num_key_value_heads=d["H"])))
        with torch.no_grad():  # a correction bias that changes the choice (not the weights)
            model.model.layers[1].mlp.gate.e_score_correction_bias.copy_(0.1 * torch.randn(8))
    elif kind.startswith("deepseek_v3_mtp"):  # dense, with 2 MTP layers (add_mtp_layers)
        model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            intermediate_size=d["F"], first_k_dense_replace=d["L"], num_nextn_predict_layers=2,
            q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
            v_head_dim=16, rope_interleave=True,
            rope_parameters=dict(YARN, rope_theta=10000.0, mscale=1.0, mscale_all_dim=1.0),
            **dict(common, num_key_value_heads=d["H"])))
    elif kind == "qwen3_moe":  # 4 layers, 1 and 3 sparse (mlp_only_layers), unrenormalized
        common["num_hidden_layers"] = 4
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
            intermediate_size=d["F"], moe_intermediate_size=d["FE"], num_experts=d["E"],
            num_experts_per_tok=d["K"], decoder_sparse_step=1, mlp_only_layers=[0, 2],
            norm_topk_prob=False, head_dim=d["C"] // d["H"], **common))
    elif kind in ("gemma3", "gemma3_softcap"):
        g = GEMMA3
        caps = GEMMA3_CAPS if kind == "gemma3_softcap" else {}
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
            intermediate_size=d["F"], head_dim=g["HD"], query_pre_attn_scalar=g["QS"],
            sliding_window=g["W"], layer_types=g["TYPES"], rope_parameters=g["ROPE"], **caps,
            **dict(common, num_hidden_layers=g["L"], rms_norm_eps=1e-6, tie_word_embeddings=True)))
    elif kind == "gemma2":
        g = GEMMA2
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(
            intermediate_size=d["F"], head_dim=g["HD"], query_pre_attn_scalar=g["QS"],
            sliding_window=g["W"], rope_parameters={"rope_type": "default", "rope_theta": g["THETA"]},
            **g["CAPS"], **dict(common, num_hidden_layers=g["L"], rms_norm_eps=1e-6,
                                tie_word_embeddings=True), attn_implementation="eager"))
    elif kind == "olmo2":
        model = tf.Olmo2ForCausalLM(tf.Olmo2Config(intermediate_size=d["F"], **common))
    elif kind == "mixtral":
        model = tf.MixtralForCausalLM(tf.MixtralConfig(
            intermediate_size=d["FE"], num_local_experts=d["E"], num_experts_per_tok=d["K"],
            **common))
    else:
        rope = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
                if kind == "llama3" else dict(YARN) if kind == "llama_yarn" else None)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(intermediate_size=d["F"], rope_scaling=rope,
                                                   rope_theta=500000.0 if rope else 10000.0,
                                                   **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "norm" in name or "ln_" in name
            one = 0 if kind.startswith("gemma") else 1  # Gemma's norms: 1 + w, w around 0
            p.copy_(one + 0.1 * torch.randn_like(p) if norm and name.endswith("weight")
                    else 0.05 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    if kind.startswith("deepseek_v3_mtp") or kind == "deepseek_v3_moe_mtp":
        add_mtp_layers(model, out, kind.endswith("_dupdiff"))


def add_mtp_layers(model, out, dupdiff):
    """DeepSeek-V3's MTP layers (model.layers.{L + k}), which transformers' main model does not
    hold, written beside its weights with safetensors: enorm, hnorm, eh_proj, a decoder block made
    by transformers' own DeepseekV3DecoderLayer (dense, or a MoE layer as DeepSeek-V3's when the
    model has MoE layers: its index past first_k_dense_replace; the experts written per expert as
    the main layers' are in the file), shared_head.norm, and the copies of the embedding and head
    DeepSeek's files carry (dupdiff: one element of a head copy changed)."""
    import safetensors.torch as st
    import torch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
    cfg, L, C = model.config, model.config.num_hidden_layers, model.config.hidden_size
    w = st.load_file(f"{out}/model.safetensors")
    for k in range(cfg.num_nextn_predict_layers):
        p = f"model.layers.{L + k}."
        moe = cfg.first_k_dense_replace < L
        block = DeepseekV3DecoderLayer(cfg, L + k if moe else 0)
        new = {n: t for n, t in block.state_dict().items() if ".experts." not in n}
        for e in range(cfg.n_routed_experts if moe else 0):
            F = cfg.moe_intermediate_size
            new.update({f"mlp.experts.{e}.{a}_proj.weight": torch.empty(F, C) for a in ("gate", "up")})
            new[f"mlp.experts.{e}.down_proj.weight"] = torch.empty(C, F)
        new.update({"enorm.weight": torch.empty(C), "hnorm.weight": torch.empty(C),
                    "eh_proj.weight": torch.empty(C, 2 * C),
                    "shared_head.norm.weight": torch.empty(C)})
        for n, t in new.items():
            w[p + n] = (1 + 0.1 * torch.randn_like(t) if "norm" in n else
                        0.05 * torch.randn_like(t)).contiguous()
        w[p + "embed_tokens.weight"] = w["model.embed_tokens.weight"].clone()
        w[p + "shared_head.head.weight"] = w["lm_head.weight"].clone()
    if dupdiff:
        w[f"model.layers.{L + 1}.shared_head.head.weight"][7, 3] += 1e-3
    st.save_file(w, f"{out}/model.safetensors", metadata={"format": "pt"})


if __name__ == "__main__":
    if sys.argv[1] == "transformers":
        make_with_transformers(sys.argv[2], sys.argv[3])
        sys.exit(0)
    if sys.argv[1] == "compare":
        compare(*sys.argv[2:5])
        sys.exit(0)
    args, opts, sets = sys.argv[2:], {}, []
    kind, out = args[0], args[1]
    i = 2
    while i < len(args):
        if args[i] == "--set":
            sets.append(args[i + 1])
        else:
            opts[args[i][2:].replace("-", "_")] = args[i + 1]
        i += 2
    make(kind, out, opts.get("dtype", "f32"), int(opts.get("shards", 1)), int(opts.get("seed", 1)),
         sets, opts.get("bad_shape"), opts.get("bad_dtype"), opts.get("hub_names") == "1")
