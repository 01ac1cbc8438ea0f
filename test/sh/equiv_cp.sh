#!/usr/bin/env bash
# Context parallelism in the equivalence harness: cp 2 and 4 in both layouts and both
# communication modes, with tp (and sp), with pp and with dp/ZeRO, gpt2 (learned positions follow the
# tokens) and llama (RoPE), resume across cp layouts, and sequences that cannot split refused.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-cp 4 2
EQ="python3 test/tools/equiv.py --steps 8"

$EQ --name _cp_llama --config $TMP/llama.yaml --layout "cp=2" --layout "cp=4" \
    --layout "cp=2 parallel.cp_layout=contiguous" --layout "cp=2 parallel.cp_comm=allgather" \
    --layout "cp=2 tp=2" --layout "cp=2 dp=2 zero=1" --layout "cp=2 dp=2 zero=3" \
    --layout "cp=2 tp=2 sp=true" --layout "dp=2 tp=2 cp=2 sp=true zero=1" \
    --layout "cp=2 pp=2" --layout "cp=4 pp=2 parallel.cp_layout=contiguous sched=afab"
$EQ --name _cp_gpt2 --config $TMP/gpt2.yaml --layout "cp=2" --layout "cp=4 parallel.cp_layout=contiguous" \
    --layout "cp=2 tp=2 dp=2 zero=2" --layout "cp=2 train.recompute=full" \
    --layout "cp=2 pp=2 dp=2 zero=1"
$EQ --name _cp --config $TMP/llama.yaml --save-layout "cp=4" --resume-at 4 --layout "cp=2 dp=2" --layout "cp=1"
$EQ --name _cp --config $TMP/gpt2.yaml --save-layout "dp=2 tp=2" --resume-at 4 --layout "cp=2 tp=2"

expect_exit cp_seq_not_divisible_exits_2 2 "seq_len" -- \
    $UST validate $TMP/llama.yaml --set parallel.cp=3 --set train.seq_len=32 --world 3
exit 0
