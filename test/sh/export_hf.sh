#!/usr/bin/env bash
# `ustrain export CKPT --to hf OUT`: tiny llama (untied and tied, grouped-query), gpt2 (with
# grouped-query heads, which GPT-2's fused c_attn must repeat) and a llama with experts in every
# layer (exported as Mixtral) are trained for a few steps and
# exported; test/tools/hf_export_check.py checks the safetensors framing, the transformers names
# and shapes, every value against the checkpoint and config.json. Where torch and transformers
# can be installed, transformers' loss on the validation windows must equal ustrain's val_loss
# at the exported weights. Bad input exits 2 and leaves OUT untouched.
. "$(dirname "$0")/../lib.sh"

CHECK="python3 test/tools/hf_export_check.py"
need_py export_python_deps numpy safetensors || exit 0

$UST data demo $TMP/data >/dev/null
# vocab 300 pads to 384 rows in ustrain (vocab_pad 128): the export must cut them.
# val_every = steps: val_loss is measured at the weights the last checkpoint holds.
cat >$TMP/template.yaml <<EOT
run:   {name: export-llama, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 6, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: "$TMP/data/val_*.bin", val_every: 6, val_steps: 2}
checkpoint: {dir: $TMP/RUN/ckpt, every: 6}
logging: {metrics_file: $TMP/RUN/metrics.jsonl}
EOT
model_json() { # model_json ARCH TIED [MOE]: MOE adds the Mixtral fields
    echo "{\"arch\": \"$1\", \"n_layer\": 2, \"d_model\": 64, \"n_head\": 4, \"n_kv_head\": 2, \"d_ff\": 96," \
        "\"vocab_size\": 300, \"vocab_padded\": 384, \"max_seq_len\": 64, \"tied\": $2" \
        "${3:+, \"experts\": 4, \"top_k\": 2, \"d_ff_expert\": 48}}"
}
MOE_YAML="moe: {num_experts: 4, top_k: 2, d_ff_expert: 48, every: 1, aux_loss_coef: 0.01}"

# train_export TAG ARCH TIED: trains $TMP/TAG and exports its step_6 to $TMP/TAG-hf
train_export() {
    sed -e "s#RUN#$1#g" -e "s/arch: llama/arch: $2/" $TMP/template.yaml >$TMP/$1.yaml
    [ "$3" = true ] && sed -i 's/max_seq_len: 64}/max_seq_len: 64, tie_embeddings: true}/' $TMP/$1.yaml
    [ -n "${4:-}" ] && sed -i "s/max_seq_len: 64}/max_seq_len: 64, $MOE_YAML}/" $TMP/$1.yaml
    if ! $UST train $TMP/$1.yaml >$TMP/$1.log 2>&1; then
        fail ${1}_trains "$(tail -2 $TMP/$1.log)"
        return 1
    fi
    expect_exit ${1}_export_exits_0 0 "exported .* to $TMP/$1-hf" -- \
        $UST export $TMP/$1/ckpt/step_6 --to hf $TMP/$1-hf || return 1
    $CHECK layout $1 $TMP/$1/ckpt/step_6 $TMP/$1-hf "$(model_json $2 $3 ${4:-})"
}
train_export llama llama false
train_export llama_tied llama true
train_export gpt2 gpt2 true
train_export mixtral llama false moe

# OUT holds exactly its files (the demo data's meta.json says byte tokens: the tokenizer files
# too, test/sh/export_complete.sh checks them): no temporaries left behind
[ "$(ls -A $TMP/llama-hf | tr '\n' ' ')" = "config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json " ] &&
    pass export_leaves_only_its_files || fail export_leaves_only_its_files "$(ls -A $TMP/llama-hf)"
# a checkpoint directory stands for its newest step
$UST export $TMP/llama/ckpt --to hf $TMP/llama-hf2 >/dev/null 2>&1
cmp -s $TMP/llama-hf/model.safetensors $TMP/llama-hf2/model.safetensors &&
    cmp -s $TMP/llama-hf/config.json $TMP/llama-hf2/config.json &&
    pass export_of_checkpoint_dir_takes_newest_step || fail export_of_checkpoint_dir_takes_newest_step "outputs differ"

# --- transformers itself: loads every weight, and its loss equals ustrain's at the same weights
if need_py export_transformers_comparison torch transformers; then
    for t in llama llama_tied gpt2 mixtral; do
        vl=$(grep -o '"val_loss":[^,}]*' $TMP/$t/metrics.jsonl | tail -1 | cut -d: -f2)
        if [ -z "$vl" ]; then fail ${t}_transformers_loss_matches_ustrain "no val_loss in metrics"; continue; fi
        # 2 val steps x micro-batch 2 = 4 windows of 32 (+1) tokens from the start of val_000.bin
        $CHECK transformers $t $TMP/$t-hf $TMP/data/val_000.bin 4 32 "$vl" 2>&1 | grep -E '^(PASS|FAIL|  )'
    done
fi

# --- bad input: exit 2 with the reason, nothing written into OUT
expect_exit export_unknown_format_exits_2 2 "unknown export format --to gguf \(supported: hf\)" -- \
    $UST export $TMP/llama/ckpt/step_6 --to gguf $TMP/bad-out
expect_exit export_missing_to_exits_2 2 "missing --to" -- $UST export $TMP/llama/ckpt/step_6 $TMP/bad-out
mkdir -p $TMP/empty
expect_exit export_not_a_checkpoint_exits_2 2 "is not a checkpoint" -- $UST export $TMP/empty --to hf $TMP/bad-out
expect_exit export_missing_dir_exits_2 2 "nonexistent.*No such file" -- $UST export $TMP/nonexistent --to hf $TMP/bad-out
expect_exit export_file_as_checkpoint_exits_2 2 "not a checkpoint directory" -- \
    $UST export $TMP/template.yaml --to hf $TMP/bad-out

# copy_ckpt NAME SED: a copy of llama's step_6 whose state.json config is edited by SED (and
# resealed: what export checks behind the manifest is the subject)
copy_ckpt() {
    rm -rf $TMP/$1 && cp -r $TMP/llama/ckpt/step_6 $TMP/$1 && sed -i "$2" $TMP/$1/state.json &&
        python3 test/tools/reseal.py $TMP/$1
}
copy_ckpt moe 's/num_experts: 0/num_experts: 4/; s/shared_expert: false/shared_expert: true/'
expect_exit export_moe_with_shared_expert_exits_2 2 "the Hugging Face layouts for mixture of experts are Mixtral's.*moe.shared_expert = true" -- \
    $UST export $TMP/moe --to hf $TMP/bad-out
copy_ckpt moe2 's/num_experts: 0/num_experts: 4/'
expect_exit export_moe_config_on_dense_checkpoint_exits_2 2 "model.layers.0.mlp.router.weight" -- \
    $UST export $TMP/moe2 --to hf $TMP/bad-out
copy_ckpt shape 's/d_ff: 96/d_ff: 128/'
expect_exit export_shape_mismatch_exits_2 2 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[96, 64\] but the checkpoint's config implies \[128, 64\]" -- \
    $UST export $TMP/shape --to hf $TMP/bad-out
copy_ckpt trunc 's/x/x/'
truncate -s 1000 $TMP/trunc/model.safetensors
expect_exit export_truncated_safetensors_exits_2 2 "model.safetensors" -- $UST export $TMP/trunc --to hf $TMP/bad-out
[ ! -e $TMP/bad-out ] && pass export_bad_input_creates_no_output || fail export_bad_input_creates_no_output "$(ls -A $TMP/bad-out)"
# a failed export over an earlier good one leaves it as it was
sum_before=$(md5sum $TMP/llama-hf/* | md5sum)
$UST export $TMP/shape --to hf $TMP/llama-hf >/dev/null 2>&1
[ "$(md5sum $TMP/llama-hf/* | md5sum)" = "$sum_before" ] && [ "$(ls -A $TMP/llama-hf | wc -l)" = 5 ] &&
    pass export_failure_leaves_existing_output_untouched || fail export_failure_leaves_existing_output_untouched "OUT changed"
: >$TMP/a-file
expect_exit export_out_is_a_file_exits_2 2 "exists and is not a directory" -- \
    $UST export $TMP/llama/ckpt/step_6 --to hf $TMP/a-file
