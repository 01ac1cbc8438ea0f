#!/usr/bin/env bash
# Tensor parallelism in the equivalence harness: tp 2 and 4 with and without sequence
# parallelism, alone and with dp/ZeRO, gpt2 (tied, biases) and llama with grouped-query
# attention, resume across tp layouts, and the layouts that cannot split refused with exit 2.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-tp 8 4
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
