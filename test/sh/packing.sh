#!/usr/bin/env bash
# data.packing: first_fit: whole examples packed first-fit-decreasing into windows, masked apart
# (documents, positions reset), padding flagged and never a target. Against transformers: the
# eval loss over every packed window of a ChatML-prepared set equals transformers' loss over each
# conversation run alone (labels -100 off the mask), 1e-5 relative, one process and tp=2; the
# equivalence harness trains the same packed windows under dp/ZeRO, tp+sp, cp, pp and resumes
# across layouts; overlong examples are split or dropped (counted); padding_frac is in the
# metrics; packing without an end-of-text id exits 2.
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/chat_reference.py"
need_py packing_needs_torch torch transformers tokenizers || exit 0
$REF make $TMP/t >/dev/null 2>&1 && $REF model $TMP/qwen 640 >$TMP/model.log 2>&1 ||
    { fail packing_setup "$(tail -2 $TMP/model.log)"; exit 0; }
$UST data prep --tokenizer $TMP/t/chatml/tokenizer.json --chat chatml --val-fraction 0 --out $TMP/sft \
    $TMP/t/convs.jsonl >$TMP/prep.log 2>&1 || { fail packing_prep "$(tail -2 $TMP/prep.log)"; exit 0; }
eot=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['eot_id'])" $TMP/sft/meta.json)
want=$($REF examples $TMP/qwen $TMP/sft $eot 2>$TMP/ref.log) || { fail packing_reference "$(tail -2 $TMP/ref.log)"; exit 0; }
for layout in "1" "2 parallel.tp=2"; do
    n=${layout%% *} sets=""; [ "$n" = 1 ] || sets="--set ${layout#* }"
    tag=packed_loss_equals_each_example_alone_$(echo "$layout" | tr ' =.' '___')
    out=$(scripts/ustrun --nproc-per-node $n $UST eval $TMP/qwen --data "$TMP/sft/train_*.bin" --seq-len 200 \
        --micro-batch-size 1 --set data.packing=first_fit --set data.pack_buffer=16 $sets 2>&1)
    got=$(echo "$out" | sed -n 's/^.*eval: loss \([0-9.]*\) ppl.*/\1/p')
    python3 - "$got" "$want" <<'EOT' && pass $tag || fail $tag "ustrain '$got' transformers '$want': $(echo "$out" | tail -2)"
import sys
a, (b, nb) = float(sys.argv[1]), map(float, sys.argv[2].split())
print(f"  ustrain {a:.8f}, transformers (each conversation alone) {b:.8f} over {nb:.0f} targets: rel {abs(a - b) / b:.2e}")
assert abs(a - b) <= 1e-5 * abs(b)
EOT
done

# the equivalence harness: masked chat shards packed, every layout the same losses and windows
mkdir -p $TMP/chat && python3 test/tools/masked_shards.py chat $TMP/chat 300 256 1500
cat >$TMP/llama.yaml <<EOT
run:   {name: pack-llama, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {seq_len: 32, micro_batch_size: 1, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/chat/train_*.bin", val: null, packing: first_fit, pack_buffer: 32, shuffle: true}
EOT
EQ="python3 test/tools/equiv.py --steps 4"
$EQ --name _packed --config $TMP/llama.yaml --layout "dp=2 zero=0" --layout "dp=2 zero=3" --layout "tp=2 sp=true" \
    --layout "cp=2" --layout "pp=2 sched=zb"
$EQ --name _packed --config $TMP/llama.yaml --save-layout "dp=2 zero=1" --resume-at 2 --layout "pp=2" --layout "dp=1"
# ... and the rest of the harness's layouts: cp contiguous and every cp_comm, pp 1f1b and
# dualpipev, ep
sed -e 's/n_layer: 2/n_layer: 4/' -e 's/global_batch_size: 4/global_batch_size: 8/' $TMP/llama.yaml >$TMP/dpv.yaml
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 32}}/' $TMP/llama.yaml >$TMP/moe.yaml
$EQ --name _packed_more --config $TMP/llama.yaml --layout "cp=2 parallel.cp_layout=contiguous parallel.cp_comm=allgather" \
    --layout "cp=2 parallel.cp_comm=a2a" --layout "cp=4 parallel.cp_comm=a2a+ring parallel.cp_a2a=2" --layout "pp=2"
$EQ --name _packed_dualpipev --config $TMP/dpv.yaml --layout "pp=2 vpp=2 sched=dualpipev"
$EQ --name _packed_moe --config $TMP/moe.yaml --layout "ep=2 dp=2"

# overlong examples: split into overlapping pieces, or dropped; both counted
python3 test/tools/pack_lengths.py $TMP/long 10,50,5,12 >/dev/null
cat >$TMP/long.yaml <<EOT
run:   {name: pack-long, seed: 7}
model: {arch: llama, n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, d_ff: 64, vocab_size: 260, max_seq_len: 16}
train: {steps: 1, seq_len: 16, micro_batch_size: 1, global_batch_size: 5}
data:  {train: "$TMP/long/train_*.bin", val: null, packing: first_fit}
checkpoint: {dir: $TMP/long/ck}
logging: {metrics_file: $TMP/long/m.jsonl}
EOT
# split: 10 | 17+17+17+2 (50 in pieces of 17 overlapping by one) | 5 | 12; first-fit decreasing:
# [17] [17] [17] [12 5] [10 2 + 5 padding] (4 padding inputs of the step's 5 x 16)
expect_exit packing_overlong_split_counted 0 "4 examples packed first-fit into 5 windows of 17 tokens: padding 5.88%, 1 overlong split" -- \
    $UST train $TMP/long.yaml
grep -q '"padding_frac":0.05[,}]' $TMP/long/m.jsonl && pass packing_padding_frac_metric ||
    fail packing_padding_frac_metric "$(grep -o '"padding_frac":[^,}]*' $TMP/long/m.jsonl)"
expect_exit packing_overlong_drop_counted 0 "4 examples packed first-fit into 2 windows of 17 tokens: padding [0-9.]+%, 1 overlong dropped" -- \
    $UST train $TMP/long.yaml --set data.overlong=drop --set checkpoint.dir=$TMP/long/ck2
rm $TMP/long/meta.json
expect_exit packing_needs_an_eot_id 2 "data.packing needs the end-of-text id" -- \
    $UST train $TMP/long.yaml --set checkpoint.dir=$TMP/long/ck3
expect_exit packing_unknown_mode 2 "data.packing" -- $UST validate $TMP/long.yaml --set data.packing=best_fit
exit 0
