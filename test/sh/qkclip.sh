#!/usr/bin/env bash
# QK-clip (optimizer.qk_clip_threshold, Kimi K2's MuonClip) against a numpy reference written from
# its definition (test/tools/qkclip_ref.py): from step 1's checkpoint, step 2 is trained once with a
# threshold no logit reaches and once with one that about half the heads exceed (the median of the
# reference's per-head maxima); the clipped run's q/k rows and biases must be the plain run's
# times sqrt(tau / max) per query head (key/value heads: the least factor of their group), every
# other tensor bit for bit, and the logged max_logit and qk_clipped_heads the reference's (llama
# with grouped-query attention on Muon; gpt2 with biases on AdamW). Every layout (dp, ZeRO-3, tp,
# cp ring and Ulysses, pp, dualpipe, ep, all five) trains the one-process clipped losses; bad keys
# exit 2. The CUDA backend's path runs on the emulator in gpu_emulated.sh (emu_qkclip_*).
. "$(dirname "$0")/../lib.sh"

need_py qkclip numpy safetensors || exit 0
equiv_configs qkclip 4 2
SHARD=$(ls $TMP/data/train_*.bin | head -1)
REF="python3 test/tools/qkclip_ref.py"

# clip_step NAME CONFIG SETS...: step 2 plain and clipped from the same step 1 (global batch 4:
# step 2 reads samples 4..7)
clip_step() {
    local name=$1 cfg=$2 d=$TMP/$1
    shift 2
    local run="$UST train $cfg --set train.steps=2 --set checkpoint.every=1 --set checkpoint.keep_last=5"
    $run "$@" --set optimizer.qk_clip_threshold=1e30 --set checkpoint.dir=$d/plain \
        --set checkpoint.resume=none --set logging.metrics_file=$d/plain.jsonl >$d.out 2>&1 ||
        { fail $name "plain run: $(tail -2 $d.out)"; return; }
    local tau
    tau=$($REF tau $d/plain/step_1 $SHARD 4 4) || { fail $name "reference: $tau"; return; }
    $run "$@" --set optimizer.qk_clip_threshold=$tau --set checkpoint.dir=$d/clip \
        --set checkpoint.resume=$d/plain/step_1 --set logging.metrics_file=$d/clip.jsonl >$d.out 2>&1 ||
        { fail $name "clipped run: $(tail -2 $d.out)"; return; }
    $REF check $d/plain/step_1 $SHARD 4 4 $tau $d/plain/step_2 $d/clip/step_2 $d/clip.jsonl >$d.ref 2>&1 &&
        pass "$name $(cat $d.ref | cut -c6-)" || fail $name "$(tail -2 $d.ref)"
}
clip_step qkclip_llama_gqa_muon_matches_numpy $TMP/llama.yaml --set optimizer.name=muon
clip_step qkclip_gpt2_biases_adamw_matches_numpy $TMP/gpt2.yaml

# every layout trains the one-process clipped model: a threshold well below the steps' largest
# logits (0.10-0.14) keeps clipping on at every step (checked on one process first), and moves
# the clipped heads' weights by up to ~40%, far beyond the harness's weight tolerance
sed -i -e 's/n_layer: 2/n_layer: 4/' -e 's/global_batch_size: 4/global_batch_size: 8/' \
    -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2}}/' \
    -e 's/^optimizer: {/optimizer: {name: muon, eps: 1.0e-6, qk_clip_threshold: 0.05, /' $TMP/llama.yaml
$UST train $TMP/llama.yaml --set train.steps=3 --set checkpoint.every=0 --set checkpoint.resume=none \
    --set logging.metrics_file=$TMP/one.jsonl >$TMP/one.out 2>&1
[ "$(grep -c '"qk_clipped_heads":[1-9]' $TMP/one.jsonl)" = 3 ] && pass qkclip_harness_config_clips_every_step ||
    fail qkclip_harness_config_clips_every_step "$(grep -o '"qk_clipped_heads":[0-9]*' $TMP/one.jsonl | tr '\n' ' ')"
python3 test/tools/equiv.py --steps 3 --name _qkclip --config $TMP/llama.yaml \
    --layout "dp=2 zero=3" --layout "tp=2" --layout "cp=2" --layout "cp=2 parallel.cp_comm=a2a" \
    --layout "pp=2 vpp=2 sched=dualpipev" \
    --layout "pp=2 vpp=2 sched=dualpipe" --layout "dp=2 tp=2 pp=2 cp=2 ep=2 sp=true zero=1"
# documents masked apart: the maximum counts only the pairs a document's queries see, blocks
# skipped whole included
python3 test/tools/equiv.py --steps 3 --name _qkclip_docs --config $TMP/llama.yaml --set data.doc_mask=true \
    --layout "cp=2" --layout "cp=2 parallel.cp_comm=a2a"

# the memory plan counts the logit tables (this rank's and every rank's): plan = arena
plan_matches_arena qkclip_plan_equals_arena_dp2_tp2 $TMP/llama.yaml 4 --set parallel.dp=2 \
    --set parallel.tp=2 --set train.steps=1 --set checkpoint.every=0 --set checkpoint.resume=none

sed -e 's/qk_clip_threshold: 0.05/qk_clip_threshold: -2/' $TMP/llama.yaml >$TMP/bad.yaml
expect_exit qkclip_negative_threshold_exits_2 2 "bad.yaml:[0-9]+:[0-9]+: optimizer.qk_clip_threshold: -2 .*>= 0" -- \
    $UST validate $TMP/bad.yaml
expect_exit qkclip_with_qk_norm_exits_2 2 "qk_clip_threshold.*qk_norm" -- \
    $UST validate $TMP/llama.yaml --set model.qk_norm=true
