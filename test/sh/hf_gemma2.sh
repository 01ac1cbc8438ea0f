#!/usr/bin/env bash
# Gemma 2 (Gemma2ForCausalLM; docs/huggingface.md, Gemma 2): Gemma 3's block without q/k norms
# (GeGLU, norms by 1 + w before and after attention and the MLP, embeddings x sqrt(d_model),
# head_dim, query_pre_attn_scalar, tied embeddings), one RoPE base, windows on the even layers
# (layer_types, else transformers 4's layer_idx % 2 == 0) and both soft-caps: the attention
# scores' (model.attn_softcap, which transformers' Gemma 2 applies in its eager attention, unlike
# Gemma 3) and the logits' (model.final_softcap). Helpers: test/hf_lib.sh. A numpy-made directory
# (transformers 4's keys: rope_theta, no layer_types) imports and exports bit-identically as
# Gemma 2 and trains the one-process losses under cp=2; against transformers' own tiny
# Gemma2ForCausalLM (4 layers, window 8 of 32 tokens, caps 0.15 and 1.0 that bend its scores and
# logits): the loss within 1e-5 relative, also with its config in transformers 4's keys (the
# parity rule), the re-export bit-identical, greedy generate token-identical for 32 tokens, after
# 10 steps under dp=2 x tp=2 the export loads with every key used and gives ustrain's loss; a
# YAML model with the options exports as Gemma 2. Bad configs exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"
need_py hf_gemma2_python_deps numpy || exit 0
. "$(dirname "$0")/../hf_lib.sh"

roundtrip gemma2_bf16 gemma2 --dtype bf16
python3 - $TMP <<'EOF2'
import json, sys
a = json.load(open(f"{sys.argv[1]}/gemma2_bf16-out/config.json"))
ok = (a["architectures"] == ["Gemma2ForCausalLM"] and a["model_type"] == "gemma2" and
      a["layer_types"] == ["sliding_attention", "full_attention"] * 2 and a["sliding_window"] == 8
      and a["attn_logit_softcapping"] == 0.15 and a["final_logit_softcapping"] == 1.0
      and a["rope_theta"] == 5e4 and a["head_dim"] == 24 and a["query_pre_attn_scalar"] == 20)
print("PASS gemma2_exports_as_gemma2" if ok else f"FAIL gemma2_exports_as_gemma2: {a}")
EOF2
expect_exit gemma2_validate_prints_the_caps 0 "attention scores soft-capped: 0.15 tanh\(s / 0.15\)" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/gemma2_bf16
expect_exit gemma2_validate_prints_the_block 0 "block: GeGLU MLP, norms by \(1 \+ w\), norms before and after attention and the MLP, embeddings x sqrt\(d_model\), head_dim 24, logits / sqrt\(20\)$" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/gemma2_bf16
$EQ --name _hf_gemma2 --set model.init_from=$TMP/gemma2_bf16 --layout "cp=2"
HAVE_TF=0
need_py hf_gemma2_transformers torch transformers && HAVE_TF=1
if [ "$HAVE_TF" = 1 ] && loss_both_ways gemma2 gemma2; then
    d=$TMP/tf-gemma2
    $MAKE compare gemma2_transformers_reexport $d $d-out
    # the same weights under transformers 4's keys: no layer_types (the even layers slide)
    mkdir -p $d-v4 && ln -s $d/model.safetensors $d-v4/
    python3 - $d <<'EOF2'
import json, sys
c = json.load(open(f"{sys.argv[1]}/config.json"))
c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
del c["layer_types"]
json.dump(c, open(f"{sys.argv[1]}-v4/config.json", "w"))
EOF2
    vl=$($UST train $TMP/run.yaml --set model.init_from=$d-v4 --set checkpoint.dir=$d-v4-ck 2>&1 |
        sed -n 's/^step 0: val_loss \([0-9.]*\).*/\1/p')
    python3 test/tools/hf_export_check.py transformers gemma2_v4_config $d-v4 $TMP/data/val_000.bin 4 32 "${vl:-0}" 1e-5 2>&1 |
        grep -E '^(PASS|FAIL|  )'
    greedy_generate gemma2 $d
    trained_export gemma2_trained_dp2_tp2 $d 4 --set parallel.dp=2 --set parallel.tp=2
fi

# bad input: what Gemma2ForCausalLM can say and ustrain does not compute
bad() { # bad NAME PATTERN SET...: the numpy-made directory with SET patched exits 2 on train
    local n=$1 pat=$2
    shift 2
    $MAKE make gemma2 $TMP/b-$n "$@"
    expect_exit gemma2_${n}_exits_2 2 "$pat" -- \
        $UST train $TMP/run.yaml --set model.init_from=$TMP/b-$n --set checkpoint.dir=$TMP/b
}
bad attn_cap_zero "'attn_logit_softcapping' = 0: expected a positive number" --set 'attn_logit_softcapping=0'
bad rope_yarn "rope_type 'yarn' is not supported for Gemma2ForCausalLM" \
    --set 'rope_scaling={"rope_type": "yarn", "factor": 2.0}'
bad bidirectional "'use_bidirectional_attention': true is not supported" \
    --set 'use_bidirectional_attention=true'
bad bias "'attention_bias': true is not supported \(Gemma2ForCausalLM" --set 'attention_bias=true'
bad act "hidden_activation 'gelu' is not supported" --set 'hidden_activation="gelu"'
bad window_null "'sliding_window' is missing" --set 'sliding_window=null'
# absent caps are Gemma2Config's defaults (50 and 30), null ones none
$MAKE make gemma2 $TMP/g2-nocaps
python3 - $TMP/g2-nocaps <<'EOF2'
import json, sys
p = f"{sys.argv[1]}/config.json"
c = json.load(open(p))
del c["attn_logit_softcapping"]
c["final_logit_softcapping"] = None
json.dump(c, open(p, "w"))
EOF2
out=$($UST validate $TMP/run.yaml --set model.init_from=$TMP/g2-nocaps 2>&1)
echo "$out" | grep -q "attention scores soft-capped: 50 tanh" && ! echo "$out" | grep -q "final logits" &&
    pass gemma2_absent_cap_is_50_null_is_none || fail gemma2_absent_cap_is_50_null_is_none "$(echo "$out" | grep capped)"
# from YAML: Gemma's options without model.qk_norm (untied, a cap on the scores) export as
# Gemma 2, and after 10 steps transformers gives the run's loss; Gemma 2 has one RoPE base
G2="--set model.arch=llama --set model.norm_offset=true --set model.sandwich_norm=true
    --set model.embed_scale=true --set model.hidden_act=gelu_tanh --set model.attn_softcap=0.5
    --set model.sliding_window=[8,64,8,64] --set model.max_seq_len=64"
if [ "$HAVE_TF" = 1 ]; then
    trained_export gemma2_yaml_untied null 1 $G2
    grep -q '"Gemma2ForCausalLM"' $TMP/gemma2_yaml_untied-out/config.json &&
        pass gemma2_yaml_exports_as_gemma2 || fail gemma2_yaml_exports_as_gemma2 "not Gemma 2"
fi
$UST train $TMP/eq.yaml $G2 --set model.rope_local_theta=1000 --set checkpoint.dir=$TMP/y3-ck \
    --set train.steps=1 --set checkpoint.every=1 >$TMP/y3.log 2>&1 ||
    fail gemma2_local_theta_trains "$(tail -2 $TMP/y3.log)"
expect_exit gemma2_local_theta_export_exits_2 2 "Gemma2ForCausalLM \(without, and without rope_local_theta\)" -- \
    $UST export $TMP/y3-ck --to hf $TMP/y3-out
exit 0
