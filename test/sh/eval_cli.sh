#!/usr/bin/env bash
# `ustrain eval CKPT --data GLOB`: the loss of a checkpoint over GLOB's windows is the validation
# loss training measured at the same weights on the same windows, one process or any layout under
# scripts/ustrun (tp=2, pp=2, dp=2, cp=2 against one process); --seq-len / --micro-batch-size /
# --steps choose the windows and the token count says how many; the checkpoint is only read.
# Bad input exits 2 before any work.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
# val_every = steps: val_loss is measured at the weights the last checkpoint holds
cat >$TMP/run.yaml <<EOT
run:   {name: eval, seed: 11, out_dir: $TMP/run}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 6, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: "$TMP/data/val_*.bin", val_every: 6, val_steps: 2}
checkpoint: {dir: $TMP/run/ckpt, every: 6}
logging: {metrics_file: $TMP/run/metrics.jsonl}
EOT
if ! $UST train $TMP/run.yaml >$TMP/train.log 2>&1; then
    fail eval_training_runs "$(tail -2 $TMP/train.log)"
    exit 0
fi
VAL="$TMP/data/val_*.bin"
CK=$TMP/run/ckpt/step_6
vl=$(grep -o '"val_loss":[^,}]*' $TMP/run/metrics.jsonl | tail -1 | cut -d: -f2)
loss_of() { sed -n 's/.*eval: loss \([0-9.]*\) ppl.*/\1/p' | tail -1; }
sum_before=$(find $TMP/run/ckpt -type f | sort | xargs md5sum | md5sum)

# --- the validation loss at the same weights, on the same 2 micro-batches of 2 windows
out=$($UST eval $CK --data "$VAL" --steps 2 2>&1)
one=$(echo "$out" | loss_of)
# eval prints 6 decimals: at most 5e-7 of rounding from the same computation
python3 -c "import sys; sys.exit(0 if abs($one - $vl) <= 5e-7 else 1)" 2>/dev/null &&
    pass eval_loss_is_training_val_loss_at_the_same_weights ||
    fail eval_loss_is_training_val_loss_at_the_same_weights "eval '$one' vs val_loss $vl: $(echo "$out" | tail -2)"
echo "$out" | grep -qE "^eval: loss [0-9.]+ ppl [0-9.]+ tokens 128$" &&
    python3 -c "import math,sys,re; l,p=map(float,re.search(r'loss (\S+) ppl (\S+)', sys.argv[1]).groups()); sys.exit(0 if abs(math.exp(l)-p) <= 1e-3*p else 1)" "$out" &&
    pass eval_prints_loss_ppl_and_tokens || fail eval_prints_loss_ppl_and_tokens "$(echo "$out" | tail -1)"
same=$($UST eval $TMP/run/ckpt --data "$VAL" --steps 2 2>&1 | loss_of)
[ -n "$one" ] && [ "$same" = "$one" ] && pass eval_of_checkpoint_dir_takes_newest_step ||
    fail eval_of_checkpoint_dir_takes_newest_step "$same vs $one"

# --- any layout gives the numbers of one process. Tolerance 2e-6: the same fp32 math, with the
# tensor- and context-parallel parts summed in another order (measured: equal to the 6 printed
# decimals for each of these)
for lay in "tp=2" "pp=2" "dp=2" "cp=2"; do
    out=$(scripts/ustrun --nproc-per-node 2 $UST eval $CK --data "$VAL" --steps 2 --set parallel.$lay 2>&1)
    got=$(echo "$out" | loss_of)
    [ -n "$got" ] && python3 -c "import sys; sys.exit(0 if abs($got - $one) <= 2e-6 else 1)" &&
        [ "$(echo "$out" | grep -c 'eval: loss')" = 1 ] &&
        pass "eval_${lay/=/}_under_ustrun_matches_one_process" ||
        fail "eval_${lay/=/}_under_ustrun_matches_one_process" "$got vs $one: $(echo "$out" | tail -2)"
done

# --- a checkpoint is layout-free: one trained under tp=2 pp=2 (4 ranks) is evaluated on one process
# (the layout is the world eval runs in, not the training run's) with the loss 4 ranks give, and
# eval prints no training notes (no "resuming from", no blend change)
sed -e "s/name: eval,/name: eval4,/" -e "s|$TMP/run|$TMP/run4|g" -e "s/steps: 6,/steps: 2,/" \
    -e "s/val_every: 6/val_every: 2/" -e "s/every: 6/every: 2/" $TMP/run.yaml >$TMP/run4.yaml
echo "parallel: {tp: 2, pp: 2}" >>$TMP/run4.yaml
if scripts/ustrun --nproc-per-node 4 $UST train $TMP/run4.yaml >$TMP/train4.log 2>&1; then
    out1=$($UST eval $TMP/run4/ckpt/step_2 --data "$VAL" --steps 2 2>&1)
    l1=$(echo "$out1" | loss_of)
    l4=$(scripts/ustrun --nproc-per-node 4 $UST eval $TMP/run4/ckpt/step_2 --data "$VAL" --steps 2 \
        --set parallel.tp=2 --set parallel.pp=2 2>&1 | loss_of)
    [ -n "$l1" ] && python3 -c "import sys; sys.exit(0 if abs($l1 - $l4) <= 2e-6 else 1)" 2>/dev/null &&
        pass eval_of_a_4_rank_checkpoint_on_one_process || fail eval_of_a_4_rank_checkpoint_on_one_process \
        "one process '$l1' vs 4 ranks '$l4': $(echo "$out1" | tail -2)"
    # export and generate read it on one process too (the layout is never the checkpoint's)
    $UST export $TMP/run4/ckpt/step_2 --to hf $TMP/hf4 >$TMP/exp4.log 2>&1 &&
        $UST generate $TMP/run4/ckpt/step_2 --prompt hi --max-new-tokens 2 --tokenizer bytes >$TMP/gen4.log 2>&1 &&
        pass export_and_generate_of_a_4_rank_checkpoint_on_one_process ||
        fail export_and_generate_of_a_4_rank_checkpoint_on_one_process "$(tail -1 $TMP/exp4.log) $(tail -1 $TMP/gen4.log)"
else
    fail eval_of_a_4_rank_checkpoint_on_one_process "training tp=2 pp=2: $(tail -2 $TMP/train4.log)"
fi

out0=$($UST eval $CK --data "$VAL" --steps 2 2>&1)
[ -n "$(echo "$out0" | loss_of)" ] && ! echo "$out0" | grep -qE "resuming|blend changed" &&
    pass eval_prints_no_training_notes || fail eval_prints_no_training_notes "$(echo "$out0" | head -3)"

# --- the windows: --seq-len, --micro-batch-size, --steps; by default every whole micro-batch
expect_exit eval_seq_len_and_micro_batch_choose_the_windows 0 "tokens 192$" -- \
    $UST eval $CK --data "$VAL" --seq-len 16 --micro-batch-size 3 --steps 4
ntok=$(python3 -c "import numpy as np,sys; print(int(np.fromfile(sys.argv[1], dtype=np.int32, count=3)[2]))" $TMP/data/val_000.bin 2>/dev/null ||
    python3 -c "import struct,sys; print(struct.unpack('<3i', open(sys.argv[1],'rb').read(12))[2])" $TMP/data/val_000.bin)
want=$(( (ntok - 1) / 32 / 2 * 2 * 32 ))
expect_exit eval_default_steps_cover_every_whole_micro_batch 0 "tokens $want$" -- $UST eval $CK --data "$VAL"
[ "$(find $TMP/run/ckpt -type f | sort | xargs md5sum | md5sum)" = "$sum_before" ] &&
    [ "$(ls $TMP/run/ckpt | tr '\n' ' ')" = "latest step_6 " ] &&
    pass eval_leaves_the_checkpoint_as_it_was || fail eval_leaves_the_checkpoint_as_it_was "$(ls -A $TMP/run/ckpt)"

# --- bad input: exit 2 with the reason
expect_exit eval_missing_checkpoint_exits_2 2 "eval: $TMP/nope: No such file" -- $UST eval $TMP/nope --data "$VAL"
mkdir -p $TMP/empty
expect_exit eval_not_a_checkpoint_exits_2 2 "neither a checkpoint .* nor a Hugging Face model directory" -- \
    $UST eval $TMP/empty --data "$VAL"
expect_exit eval_empty_glob_exits_2 2 "$TMP/data/none_\*.bin" -- $UST eval $CK --data "$TMP/data/none_*.bin"
expect_exit eval_seq_len_beyond_max_seq_len_exits_2 2 "--seq-len 65 is beyond the model's max_seq_len 64" -- \
    $UST eval $CK --data "$VAL" --seq-len 65
expect_exit eval_zero_steps_exits_2 2 "--steps 0: expected 1..1000000" -- $UST eval $CK --data "$VAL" --steps 0
expect_exit eval_more_steps_than_the_data_exits_2 2 "--steps 1000000: --data .* holds [0-9]+ micro-batches" -- \
    $UST eval $CK --data "$VAL" --steps 1000000
expect_exit eval_missing_data_exits_2 2 "missing --data GLOB" -- $UST eval $CK
expect_exit eval_unknown_option_exits_2 2 "unknown option --bogus for eval" -- $UST eval $CK --data "$VAL" --bogus 1
expect_exit eval_bad_set_exits_2 2 "parallel.tp" -- $UST eval $CK --data "$VAL" --set parallel.tp=3
expect_exit eval_layout_without_the_ranks_exits_2 2 "the world has 1 ranks" -- \
    $UST eval $CK --data "$VAL" --set parallel.tp=2
# a Hugging Face directory (the checkpoint's export): the same loss, the weights read through the
# importer, under one process and tp=2
$UST export $CK --to hf $TMP/hfdir >/dev/null 2>&1
a=$($UST eval $CK --data "$VAL" --steps 2 2>&1 | loss_of)
b=$($UST eval $TMP/hfdir --data "$VAL" --steps 2 --seq-len 32 --micro-batch-size 2 2>&1 | loss_of)
c=$(scripts/ustrun --nproc-per-node 2 $UST eval $TMP/hfdir --data "$VAL" --steps 2 --seq-len 32 --micro-batch-size 2 \
    --set parallel.tp=2 2>&1 | loss_of)
python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(not (abs(a - b) <= 2e-6 and abs(a - c) <= 2e-6))" \
    "$a" "$b" "$c" 2>/dev/null && pass eval_hf_directory_equals_its_checkpoint ||
    fail eval_hf_directory_equals_its_checkpoint "checkpoint '$a', hf '$b', hf tp=2 '$c'"
expect_exit eval_help_exits_0 0 "usage: ustrain eval CKPT_OR_HF_DIR --data GLOB" -- $UST eval --help
expect_exit ustrain_help_lists_eval 0 "eval CKPT_OR_HF_DIR --data GLOB" -- $UST --help

# --- against an independent computation: transformers' loss over the same windows of the exported
# checkpoint (training's val_loss above comes from the same code as eval; this does not)
if need_py eval_loss_matches_transformers_on_the_export torch transformers numpy; then
    $UST export $CK --to hf $TMP/hf >/dev/null 2>&1
    # 2 steps x micro-batch 2 = the first 4 windows of 32 (+1) tokens of val_000.bin
    python3 test/tools/hf_export_check.py transformers eval $TMP/hf $TMP/data/val_000.bin 4 32 "$one" 2>&1 |
        grep -E '^(PASS|FAIL)' | sed 's/^\(PASS\|FAIL\) eval_transformers_loss_matches_ustrain/\1 eval_loss_matches_transformers_on_the_export/'
fi
