#!/usr/bin/env python3
"""Checks `ustrain export --to hf` output against the transformers conventions, independently of
the C code. Prints PASS/FAIL lines (test/lib.sh style), exits 0 either way unless it crashed.

  hf_export_check.py layout TAG STEP_DIR OUT_DIR MODEL_JSON
      MODEL_JSON: the model the test trained, {"arch", "n_layer", "d_model", "n_head",
      "n_kv_head", "d_ff", "vocab_size", "vocab_padded", "max_seq_len", "tied"} and, for a
      mixture of experts in every layer (exported as MixtralForCausalLM), "experts", "top_k",
      "d_ff_expert".
      Checks the safetensors framing (8-byte little-endian header length, JSON header with
      dtype/shape/data_offsets, "__metadata__": {"format": "pt"}, contiguous F32 data), that the
      names and shapes are exactly LlamaForCausalLM's / GPT2LMHeadModel's, that every value is
      the checkpoint's under the documented mapping (vocabulary cut to vocab_size rows; GPT-2
      Conv1D weights transposed; c_attn = q | k | v with key/value heads repeated for the query
      heads that read them) and that config.json carries the model's hyperparameters.
  hf_export_check.py transformers TAG OUT_DIR VAL_SHARD NWIN T EXPECTED_LOSS [REL_TOL]
      Loads OUT_DIR with transformers.AutoModelForCausalLM (no missing or unexpected keys) and
      compares its mean cross-entropy over the first NWIN windows of T+1 tokens of the llm.c
      shard with ustrain's val_loss at the same weights. Tolerance 1e-4: both compute in fp32 on
      the same NWIN*T target tokens; measured differences are <= 6e-7, while a wrong mapping
      (gpt2 with key/value heads repeated in the wrong order) moved the loss by 1.1e-2."""
import json
import struct
import sys

import numpy as np


def result(ok, name, why=""):
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}")
    return ok


def read_safetensors(path):
    """-> (header dict, {name: np.float32 array}, problems list), by hand from the framing."""
    raw = open(path, "rb").read()
    problems = []
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    if (8 + n) % 8:
        problems.append(f"data starts at byte {8 + n}, not 8-aligned")
    tensors, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            problems.append(f"{name} has dtype {e['dtype']}")
        b, end = e["data_offsets"]
        count = int(np.prod(e["shape"])) if e["shape"] else 1
        if end - b != 4 * count:
            problems.append(f"{name}: {end - b} bytes for shape {e['shape']}")
        spans.append((b, end))
        tensors[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
    spans.sort()
    pos = 0
    for b, end in spans:
        if b != pos:
            problems.append(f"data gap or overlap at offset {b} (expected {pos})")
        pos = end
    if pos != len(data):
        problems.append(f"tensors cover {pos} of {len(data)} data bytes")
    return header, tensors, problems


def expected_tensors(m, ck):
    """The transformers tensors, made from the checkpoint's with numpy (the mapping under test)."""
    V, L = m["vocab_size"], m["n_layer"]
    H, Hkv = m["n_head"], m["n_kv_head"]
    D = m["d_model"] // H
    out = {}
    if m["arch"] == "llama":
        out["model.embed_tokens.weight"] = ck["model.embed_tokens.weight"][:V]
        for i in range(L):
            mlp = [] if m.get("experts") else [
                "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
            for s in ["input_layernorm.weight", "post_attention_layernorm.weight",
                      "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                      "self_attn.v_proj.weight", "self_attn.o_proj.weight"] + mlp:
                n = f"model.layers.{i}.{s}"
                out[n] = ck[n]
            if m.get("experts"):  # Mixtral: gate = router, w1/w2/w3 = gate/down/up projections
                p, q = f"model.layers.{i}.block_sparse_moe.", f"model.layers.{i}.mlp."
                out[p + "gate.weight"] = ck[q + "router.weight"]
                for e in range(m["experts"]):
                    for w, ours in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
                        out[f"{p}experts.{e}.{w}.weight"] = ck[f"{q}experts.{e}.{ours}.weight"]
        out["model.norm.weight"] = ck["model.norm.weight"]
        if not m["tied"]:
            out["lm_head.weight"] = ck["lm_head.weight"][:V]
        return out

    def rep(kv):  # [Hkv*D, ...] -> [H*D, ...]: query head h reads key/value head h // (H/Hkv)
        return np.repeat(kv.reshape(Hkv, D, -1), H // Hkv, axis=0).reshape(H * D, *kv.shape[1:])

    out["transformer.wte.weight"] = ck["model.embed_tokens.weight"][:V]
    out["transformer.wpe.weight"] = ck["model.embed_positions.weight"]
    for i in range(L):
        s, h = f"model.layers.{i}.", f"transformer.h.{i}."
        g = lambda n: ck[s + n]
        out[h + "ln_1.weight"] = g("input_layernorm.weight")
        out[h + "ln_1.bias"] = g("input_layernorm.bias")
        out[h + "attn.c_attn.weight"] = np.concatenate(
            [g("self_attn.q_proj.weight"), rep(g("self_attn.k_proj.weight")),
             rep(g("self_attn.v_proj.weight"))], 0).T
        out[h + "attn.c_attn.bias"] = np.concatenate(
            [g("self_attn.q_proj.bias"), rep(g("self_attn.k_proj.bias")),
             rep(g("self_attn.v_proj.bias"))])
        out[h + "attn.c_proj.weight"] = g("self_attn.o_proj.weight").T
        out[h + "attn.c_proj.bias"] = g("self_attn.o_proj.bias")
        out[h + "ln_2.weight"] = g("post_attention_layernorm.weight")
        out[h + "ln_2.bias"] = g("post_attention_layernorm.bias")
        out[h + "mlp.c_fc.weight"] = g("mlp.up_proj.weight").T
        out[h + "mlp.c_fc.bias"] = g("mlp.up_proj.bias")
        out[h + "mlp.c_proj.weight"] = g("mlp.down_proj.weight").T
        out[h + "mlp.c_proj.bias"] = g("mlp.down_proj.bias")
    out["transformer.ln_f.weight"] = ck["model.norm.weight"]
    out["transformer.ln_f.bias"] = ck["model.norm.bias"]
    return out


def expected_shapes(m):
    """Names and shapes as transformers' own modules declare them, written out from the model."""
    V, C, F, L = m["vocab_size"], m["d_model"], m["d_ff"], m["n_layer"]
    D = C // m["n_head"]
    HD, KV, T = m["n_head"] * D, m["n_kv_head"] * D, m["max_seq_len"]
    s = {}
    if m["arch"] == "llama":
        s["model.embed_tokens.weight"] = [V, C]
        for i in range(L):
            p = f"model.layers.{i}."
            s.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                      p + "self_attn.q_proj.weight": [HD, C], p + "self_attn.k_proj.weight": [KV, C],
                      p + "self_attn.v_proj.weight": [KV, C], p + "self_attn.o_proj.weight": [C, HD]})
            if not m.get("experts"):
                s.update({p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                          p + "mlp.down_proj.weight": [C, F]})
                continue
            E, Fe, b = m["experts"], m["d_ff_expert"], p + "block_sparse_moe."
            s[b + "gate.weight"] = [E, C]
            for e in range(E):
                s.update({f"{b}experts.{e}.w1.weight": [Fe, C], f"{b}experts.{e}.w2.weight": [C, Fe],
                          f"{b}experts.{e}.w3.weight": [Fe, C]})
        s["model.norm.weight"] = [C]
        if not m["tied"]:
            s["lm_head.weight"] = [V, C]
        return s
    s["transformer.wte.weight"] = [V, C]
    s["transformer.wpe.weight"] = [T, C]
    for i in range(L):  # Conv1D: weight [in, out]
        p = f"transformer.h.{i}."
        s.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C], p + "ln_2.weight": [C],
                  p + "ln_2.bias": [C], p + "attn.c_attn.weight": [C, 3 * C],
                  p + "attn.c_attn.bias": [3 * C], p + "attn.c_proj.weight": [C, C],
                  p + "attn.c_proj.bias": [C], p + "mlp.c_fc.weight": [C, F],
                  p + "mlp.c_fc.bias": [F], p + "mlp.c_proj.weight": [F, C],
                  p + "mlp.c_proj.bias": [C]})
    s["transformer.ln_f.weight"] = [C]
    s["transformer.ln_f.bias"] = [C]
    return s


def expected_config(m):
    if m.get("experts"):
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": m["d_model"], "intermediate_size": m["d_ff_expert"],
                "num_local_experts": m["experts"], "num_experts_per_tok": m["top_k"],
                "num_attention_heads": m["n_head"], "num_key_value_heads": m["n_kv_head"],
                "num_hidden_layers": m["n_layer"], "rms_norm_eps": 1e-5, "rope_theta": 10000,
                "max_position_embeddings": m["max_seq_len"], "vocab_size": m["vocab_size"],
                "tie_word_embeddings": m["tied"], "torch_dtype": "float32", "hidden_act": "silu",
                "output_router_logits": False}
    if m["arch"] == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": m["d_model"], "intermediate_size": m["d_ff"],
                "num_attention_heads": m["n_head"], "num_key_value_heads": m["n_kv_head"],
                "num_hidden_layers": m["n_layer"], "rms_norm_eps": 1e-5, "rope_theta": 10000,
                "max_position_embeddings": m["max_seq_len"], "vocab_size": m["vocab_size"],
                "tie_word_embeddings": m["tied"], "torch_dtype": "float32", "hidden_act": "silu"}
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": m["d_model"],
            "n_layer": m["n_layer"], "n_head": m["n_head"], "n_positions": m["max_seq_len"],
            "n_inner": m["d_ff"], "vocab_size": m["vocab_size"], "layer_norm_epsilon": 1e-5,
            "activation_function": "gelu_new", "tie_word_embeddings": True,
            "torch_dtype": "float32"}


def check_layout(tag, step, out, model_json):
    m = json.loads(model_json)
    header, got, problems = read_safetensors(f"{out}/model.safetensors")
    result(not problems and header.get("__metadata__") == {"format": "pt"},
           f"{tag}_safetensors_framing", "; ".join(problems[:3]) or
           f"__metadata__ = {header.get('__metadata__')}")
    want = expected_shapes(m)
    result(set(got) == set(want), f"{tag}_names_are_transformers",
           f"extra {sorted(set(got) - set(want))[:4]}, missing {sorted(set(want) - set(got))[:4]}")
    bad = [n for n in want if n in got and list(got[n].shape) != want[n]]
    result(not bad, f"{tag}_shapes_are_transformers",
           ", ".join(f"{n} {list(got[n].shape)} != {want[n]}" for n in bad[:3]))
    _, ck, _ = read_safetensors(f"{step}/model.safetensors")
    padded = ck["model.embed_tokens.weight"].shape[0]
    result(padded == m["vocab_padded"] > m["vocab_size"], f"{tag}_checkpoint_vocab_is_padded",
           f"checkpoint embedding has {padded} rows; the test needs padding to exercise the cut")
    exp = expected_tensors(m, ck)
    wrong = [n for n in exp if n in got and not np.array_equal(got[n], exp[n])]
    result(not wrong and set(exp) == set(got), f"{tag}_values_are_the_checkpoints",
           f"{len(wrong)} tensors differ, first {wrong[:3]}")
    try:  # the reference reader agrees with the hand parse
        from safetensors.numpy import load_file
        ref = load_file(f"{out}/model.safetensors")
        result(set(ref) == set(got) and all(np.array_equal(ref[n], got[n]) for n in got),
               f"{tag}_safetensors_library_reads_it", "safetensors.numpy disagrees")
    except ImportError:
        result(False, f"{tag}_safetensors_library_reads_it", "safetensors not installed")
    cfg = json.load(open(f"{out}/config.json"))
    diff = {k: (cfg.get(k), v) for k, v in expected_config(m).items() if cfg.get(k) != v}
    result(not diff, f"{tag}_config_json_matches", f"(got, want): {diff}")


def check_transformers(tag, out, shard, nwin, T, expected, rel_tol=None):
    import torch
    import transformers
    c = json.load(open(f"{out}/config.json"))
    if c.get("num_nextn_predict_layers"):  # DeepSeek's MTP layers: as transformers ignores 61
        L = c["num_hidden_layers"]
        transformers.DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected = [
            rf"model\.layers\.{L + k}\..*" for k in range(c["num_nextn_predict_layers"])]
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, dtype=torch.float32)
    missing = {k: sorted(v) for k, v in info.items() if v and k != "error_msgs"}
    result(not missing and not info.get("error_msgs"), f"{tag}_transformers_loads_every_weight",
           f"{type(model).__name__}: {missing} {info.get('error_msgs')}")
    model.eval()
    hdr = np.fromfile(shard, dtype=np.int32, count=256)
    dt = np.uint16 if hdr[0] == 20240520 else np.uint32
    tok = np.fromfile(shard, dtype=dt, offset=1024).astype(np.int64)
    x = torch.tensor(np.stack([tok[i * T : i * T + T + 1] for i in range(nwin)]))
    with torch.no_grad():
        logits = model(x[:, :-1]).logits
    loss = float(torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)))
    tol = 1e-4 if rel_tol is None else rel_tol * abs(expected)
    result(abs(loss - expected) <= tol, f"{tag}_transformers_loss_matches_ustrain",
           f"transformers {loss:.7f} vs ustrain val_loss {expected:.7f}")
    print(f"  {tag}: {type(model).__name__} loss {loss:.7f}, ustrain {expected:.7f}, "
          f"|diff| {abs(loss - expected):.2e}")


if __name__ == "__main__":
    if sys.argv[1] == "layout":
        check_layout(*sys.argv[2:6])
    else:
        a = sys.argv[2:]
        check_transformers(a[0], a[1], a[2], int(a[3]), int(a[4]), float(a[5]),
                           float(a[6]) if len(a) > 6 else None)
