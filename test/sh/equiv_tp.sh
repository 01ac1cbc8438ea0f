#!/usr/bin/env bash
# Tensor parallelism in the equivalence harness: tp 2 and 4 with and without sequence
# parallelism, alone and with dp/ZeRO, gpt2 (tied, biases) and llama with grouped-query
# attention, resume across tp layouts, and the layouts that cannot split refused with exit 2.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/llama.yaml <<EOT
run:   {name: equiv-tp-llama, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 8, n_kv_head: 4, d_ff: 128, vocab_size: 500, max_seq_len: 64}
train: {seq_len: 32, micro_batch_size: 1, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
EOT
sed -e 's/arch: llama/arch: gpt2/' -e 's/n_kv_head: 4/n_kv_head: 8/' -e 's/equiv-tp-llama/equiv-tp-gpt2/' \
    $TMP/llama.yaml >$TMP/gpt2.yaml
EQ="python3 test/tools/equiv.py --steps 8"

$EQ --name _tp_llama_gqa --config $TMP/llama.yaml --layout "tp=2" --layout "tp=4" \
    --layout "tp=2 dp=2 zero=1" --layout "tp=2 dp=2 zero=3" --layout "tp=2 train.recompute=full" \
    --layout "tp=2 sp=true" --layout "tp=4 sp=true" --layout "tp=2 sp=true dp=2 zero=3"
$EQ --name _tp_gpt2 --config $TMP/gpt2.yaml --layout "tp=2" --layout "tp=4" --layout "tp=2 dp=2 zero=2" \
    --layout "tp=2 sp=true" --layout "tp=4 sp=true dp=2 zero=1" --layout "tp=2 sp=true train.recompute=selective"
$EQ --name _tp --config $TMP/llama.yaml --save-layout "tp=4" --resume-at 4 --layout "tp=2 dp=2" \
    --layout "tp=1"
$EQ --name _tp --config $TMP/gpt2.yaml --save-layout "tp=2 dp=2 zero=3" --resume-at 4 --layout "tp=4" \
    --layout "tp=2 sp=true"

expect_exit tp_heads_not_divisible_exits_2 2 "n_kv_head \(4\) must be divisible by parallel.tp \(8\)" -- \
    $UST validate $TMP/llama.yaml --set parallel.tp=8 --world 8
expect_exit tp_vocab_not_divisible_exits_2 2 "vocab" -- \
    $UST validate $TMP/gpt2.yaml --set model.n_head=6 --set model.n_kv_head=6 --set model.d_model=96 --set parallel.tp=3 --world 3
exit 0
