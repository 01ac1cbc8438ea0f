#!/usr/bin/env bash
# All five dimensions at once and the combinations the per-dimension harness scripts leave out:
# a tiny llama with MoE layers under dp=2 x tp=2 x pp=2 x cp=2 x ep=2 (16 ranks) and 3- and
# 4-dimension mixes train the single-process model; a checkpoint saved under one layout resumes
# under layouts that change dp, tp, pp, vpp, cp, ep and the ZeRO stage all at once (same losses,
# same data position); a stop signal to the launcher of a multi-dimensional job stops every rank
# after one step with a checkpoint, and the next start resumes there.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-5d 4 2
sed -i -e 's/n_layer: 2/n_layer: 4/' \
    -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2, aux_loss_coef: 0.01}}/' \
    $TMP/llama.yaml
# AdamW eps 1e-6: keeps reduction-order noise from flipping a near-tied routing choice (see
# test/sh/equiv_moe.sh)
sed -i 's/^optimizer: {/optimizer: {eps: 1.0e-6, /' $TMP/llama.yaml
EQ="python3 test/tools/equiv.py --steps 5"

$EQ --name _5d --config $TMP/llama.yaml \
    --layout "dp=2 tp=2 pp=2 cp=2 ep=2 sp=true zero=1" \
    --layout "tp=2 pp=2 cp=2" --layout "dp=2 tp=2 pp=2 ep=2 zero=2" \
    --layout "dp=2 pp=2 cp=2 ep=2 sched=afab" --layout "dp=2 tp=2 cp=2 ep=2 zero=3"
# DeepSeek-V3's pieces all at once (issue 36): latent attention with the q latent (its latent on
# the cp ring), a multi-token-prediction module, a dense layer then sigmoid-scored group-limited
# MoE layers with a shared expert and the balancing bias, under dp=2 x tp=2 x pp=2 x cp=2 x ep=2
cat >$TMP/ds.yaml <<EOT
run:   {name: equiv-5d-ds, seed: 7}
model: {arch: llama, n_layer: 4, d_model: 64, n_head: 4, n_kv_head: 4, d_ff: 96, vocab_size: 500,
        max_seq_len: 64, mtp: {depth: 1, loss_weight: 0.3},
        mla: {enabled: true, q_lora_rank: 24, kv_lora_rank: 16, qk_nope_head_dim: 12, qk_rope_head_dim: 8, v_head_dim: 16},
        moe: {num_experts: 8, top_k: 2, d_ff_expert: 32, first_dense: 1, score: sigmoid, n_group: 4,
              topk_group: 2, routed_scale: 2.5, shared_expert: true, shared_d_ff: 48, aux_loss_coef: 0,
              seq_aux_loss_coef: 0.01, bias_update_rate: 0.01}}
train: {seq_len: 32, micro_batch_size: 1, global_batch_size: 4}
optimizer: {eps: 1.0e-6, lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
EOT
$EQ --name _5d_deepseek --config $TMP/ds.yaml --layout "dp=2 tp=2 pp=2 cp=2 ep=2 sp=true zero=1"
# and a checkpoint of it saved under one layout resumes under others (same losses from step 3)
$EQ --name _5d_deepseek --config $TMP/ds.yaml --save-layout "dp=2 tp=2 pp=2 ep=2 zero=1" --resume-at 2 \
    --layout "cp=2 tp=2 sp=true zero=3 dp=2" --layout "dp=1"
$EQ --name _5d --config $TMP/llama.yaml --save-layout "dp=2 tp=2 pp=2 ep=2 zero=1" --resume-at 2 \
    --layout "dp=2 cp=2 pp=2 vpp=2 sched=interleaved zero=2" \
    --layout "dp=4 ep=4 tp=2 zero=3" --layout "dp=1"
# all seven at once: dp 2->1, tp 2->1, pp 2->4, vpp 2->1, cp 1->2, ep 2->1, ZeRO 1->2
$EQ --name _5d_all --config $TMP/llama.yaml \
    --save-layout "dp=2 tp=2 pp=2 vpp=2 sched=interleaved ep=2 zero=1" --resume-at 2 \
    --layout "pp=4 cp=2 zero=2"

# a stop signal to the launcher: every rank stops after the same step, with a checkpoint
sed -e "s#$TMP/data/train_\*.bin#$TMP/data/train_*.bin#" $TMP/llama.yaml >$TMP/stop.yaml
cat >>$TMP/stop.yaml <<EOT
checkpoint: {dir: $TMP/run/ckpt, every: 100000}
logging: {metrics_file: $TMP/run/metrics.jsonl}
EOT
L="--set parallel.dp=2 --set parallel.tp=2 --set parallel.pp=2 --set parallel.ep=2"
scripts/ustrun --nproc-per-node 8 $UST train $TMP/stop.yaml $L --set train.steps=100000 >$TMP/out 2>&1 &
launcher=$!
for _ in $(seq 600); do [ "$(cat $TMP/run/metrics.jsonl 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
kill -TERM $launcher
wait $launcher; rc=$?
step=$(sed 's/step_//' $TMP/run/ckpt/latest 2>/dev/null)
if [ $rc -eq 0 ] && [ -n "$step" ] && [ "$(grep -c 'received signal' $TMP/out)" = 1 ] &&
    [ -f $TMP/run/ckpt/step_$step/model.safetensors ]; then
    pass sigterm_to_launcher_stops_a_4d_job_at_one_step
else
    fail sigterm_to_launcher_stops_a_4d_job_at_one_step "rc=$rc step=$step: $(tail -3 $TMP/out)"
fi
out=$(scripts/ustrun --nproc-per-node 8 $UST train $TMP/stop.yaml $L --set train.steps=$((step + 1)) 2>&1)
echo "$out" | grep -q "resuming from .*step_$step" && [ "$(cat $TMP/run/ckpt/latest)" = "step_$((step + 1))" ] &&
    pass resume_after_stop_of_a_4d_job || fail resume_after_stop_of_a_4d_job "$(echo "$out" | tail -3)"
# every bundled config, the real-size layouts included, is valid for its own world size
# (hf-tiny.yaml imports a Hugging Face directory: the one the worked example of docs/huggingface.md makes)
python3 test/tools/hf_make_model.py make llama $TMP/hf-model >/dev/null 2>&1
for f in configs/*.yaml; do
    S=()
    [ "$(basename $f)" = hf-tiny.yaml ] && S=(--set model.init_from=$TMP/hf-model)
    # sft-tiny.yaml: the same directory (64 positions) and the eot id its absent data would give
    [ "$(basename $f)" = sft-tiny.yaml ] &&
        S=(--set model.init_from=$TMP/hf-model --set train.seq_len=64 --set data.eot_id=0)
    w=$($UST validate $f "${S[@]}" 2>&1 | sed -n 's/.*(world \([0-9]*\)).*/\1/p' | head -1)
    if $UST validate $f "${S[@]}" --world "$w" >$TMP/v.out 2>&1; then pass "config_$(basename $f .yaml)_validates_at_world_$w"
    else fail "config_$(basename $f .yaml)_validates" "$(tail -2 $TMP/v.out)"; fi
done
exit 0
