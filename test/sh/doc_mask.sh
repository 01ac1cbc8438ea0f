#!/usr/bin/env bash
# Document masking (data.doc_mask) and position reset (data.reset_positions) in training: many
# short documents packed into each sequence; every layout trains the one-process model (the
# equivalence harness: dp/ZeRO, tp with sp, cp zigzag ring and contiguous all-gather (blocks no
# query can see are skipped and counted), pp, ep, recompute, gpt2 with reset positions); the mask
# changes the loss (it is really applied); bad settings exit 2 before training. The op-level and
# model-level checks (packed documents equal each document alone, fp64 reference, the CUDA
# emulator against the CPU) are in test_ops, test_model and test_cuda_ops.
. "$(dirname "$0")/../lib.sh"

python3 - $TMP <<'EOT'
import json, random, sys
random.seed(1)
words = "the a cat dog runs sits on mat and of to in is it that".split()
with open(f"{sys.argv[1]}/docs.jsonl", "w") as f:
    for i in range(3000):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(2, 12)))}) + "\n")
EOT
$UST data prep --out $TMP/data $TMP/docs.jsonl >/dev/null || fail doc_prep "data prep failed"
cat >$TMP/llama.yaml <<EOT
run:   {name: docs-llama, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {seq_len: 64, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null, doc_mask: true, eot_id: 256}
EOT
sed -e 's/arch: llama/arch: gpt2/' -e 's/n_kv_head: 2/n_kv_head: 4/' -e 's/docs-llama/docs-gpt2/' \
    -e 's/eot_id: 256}/eot_id: 256, reset_positions: true}/' $TMP/llama.yaml >$TMP/gpt2.yaml
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 32}}/' \
    $TMP/llama.yaml >$TMP/moe.yaml

# the mask is applied: the same run without it has other losses
run_losses() { # run_losses TAG CONFIG SETS...: the first 3 losses of a 3-step run
    local tag=$1 cfg=$2; shift 2
    $UST train $cfg --set train.steps=3 --set checkpoint.dir=$TMP/$tag/ckpt \
        --set logging.metrics_file=$TMP/$tag/m.jsonl "$@" >$TMP/$tag.log 2>&1 || { tail -2 $TMP/$tag.log; return 1; }
    grep -o '"loss":[^,]*' $TMP/$tag/m.jsonl | tr '\n' ' '
}
a=$(run_losses masked $TMP/llama.yaml) && b=$(run_losses unmasked $TMP/llama.yaml --set data.doc_mask=false) &&
    [ -n "$a" ] && [ "$a" != "$b" ] && pass doc_mask_changes_the_losses || fail doc_mask_changes_the_losses "masked '$a' unmasked '$b'"

EQ="python3 test/tools/equiv.py --steps 6"
$EQ --name _docs_llama --config $TMP/llama.yaml --layout "dp=2 zero=1" --layout "tp=2 sp=true" \
    --layout "cp=2" --layout "cp=4 parallel.cp_layout=contiguous parallel.cp_comm=allgather" \
    --layout "pp=2" --layout "pp=2 sched=zb" --layout "cp=2 tp=2" --layout "dp=2 zero=3 train.recompute=full"
$EQ --name _docs_gpt2_reset --config $TMP/gpt2.yaml --layout "cp=2" --layout "tp=2" --layout "pp=2 dp=2"
$EQ --name _docs_moe --config $TMP/moe.yaml --layout "ep=2 dp=2" --layout "cp=2"

# cp with documents: blocks that no query of a rank can see are skipped and counted
scripts/ustrun --nproc-per-node 4 $UST train $TMP/llama.yaml --set train.steps=2 --set checkpoint.dir=$TMP/cps/ckpt \
    --set logging.metrics_file=$TMP/cps/m.jsonl --set parallel.cp=4 --set parallel.cp_layout=contiguous >$TMP/cps.log 2>&1
skipped=$(grep -o '"cp_blocks_skipped":[0-9]*' $TMP/cps/m.jsonl | tail -1 | cut -d: -f2)
[ -n "$skipped" ] && [ "$skipped" -gt 0 ] && pass doc_mask_cp_skips_hidden_blocks ||
    fail doc_mask_cp_skips_hidden_blocks "cp_blocks_skipped '$skipped': $(tail -2 $TMP/cps.log 2>/dev/null)"

# data prep's meta.json gives the end-of-text id; shards without one and no data.eot_id: exit 2
expect_exit doc_mask_takes_the_eot_id_from_meta_json 0 "done: 1 steps" -- \
    $UST train $TMP/llama.yaml --set data.eot_id=-1 --set train.steps=1 --set checkpoint.dir=$TMP/m/ckpt \
    --set logging.metrics_file=$TMP/m/m.jsonl
mkdir -p $TMP/nometa && cp $TMP/data/*.bin $TMP/nometa/
NOMETA=(--set "data.train=$TMP/nometa/train_*.bin" --set "data.val=$TMP/nometa/val_*.bin")
expect_exit doc_mask_needs_an_eot_id 2 "data.doc_mask needs the end-of-text id" -- \
    $UST train $TMP/llama.yaml "${NOMETA[@]}" --set data.eot_id=-1 --set checkpoint.dir=$TMP/x/ckpt
expect_exit reset_positions_needs_an_eot_id 2 "data.reset_positions needs the end-of-text id" -- \
    $UST train $TMP/llama.yaml "${NOMETA[@]}" --set data.eot_id=-1 --set data.doc_mask=false --set data.reset_positions=true --set checkpoint.dir=$TMP/x/ckpt
expect_exit doc_mask_eot_id_range 2 "data.eot_id" -- $UST validate $TMP/llama.yaml --set data.eot_id=99999999
# an end of text outside the vocabulary would never be seen: masking nothing, silently
expect_exit eot_id_beyond_the_vocabulary_exits_2 2 "data.eot_id \(300\) must be a token of the vocabulary, below model.vocab_size \(300\)" -- \
    $UST validate $TMP/llama.yaml --set data.eot_id=300
mkdir -p $TMP/badmeta && cp $TMP/data/*.bin $TMP/badmeta/ &&
    python3 -c "import json,sys; m=json.load(open(sys.argv[1])); m['eot_id']=600; json.dump(m, open(sys.argv[2],'w'))" $TMP/data/meta.json $TMP/badmeta/meta.json
expect_exit meta_eot_id_beyond_the_vocabulary_exits_2 2 "badmeta/meta.json: end of text is 600, not a token of model.vocab_size = 300" -- \
    $UST train $TMP/llama.yaml --set data.eot_id=-1 --set "data.train=$TMP/badmeta/train_*.bin" --set checkpoint.dir=$TMP/x/ckpt
exit 0
