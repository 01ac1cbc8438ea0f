#!/usr/bin/env bash
# data.packing on a skewed length distribution (lognormal, median ~40 tokens, tail to 4000):
# first-fit-decreasing's padding for several buffers against concat's (no padding, but examples
# cut across window edges), and the time packing takes at startup.
#   scripts/bench-packing.sh [USTRAIN] [EXAMPLES] [SEQ_LEN]
set -eu
UST=${1:-./ustrain} N=${2:-50000} T=${3:-1024}
D=$(mktemp -d /tmp/ustrain-bench-packing.XXXXXX)
trap 'rm -rf "$D"' EXIT
PY=python3; [ -x .venv/bin/python3 ] && PY=.venv/bin/python3
echo "packing $N skewed examples into windows of $T+1 tokens"
echo "$(T=$T $PY test/tools/pack_lengths.py $D skewed $N 7)"
cat >$D/run.yaml <<EOT
run:   {name: bench-packing, seed: 7}
model: {arch: llama, n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, d_ff: 64, vocab_size: 260, max_seq_len: $T}
train: {steps: 1, seq_len: $T, micro_batch_size: 1, global_batch_size: 1}
data:  {train: "$D/train_*.bin", val: null, packing: first_fit}
checkpoint: {dir: $D/ck, every: 0}
logging: {metrics_file: $D/m.jsonl}
EOT
for buf in 10 100 1000 10000; do
    line=$($UST train $D/run.yaml --set data.pack_buffer=$buf 2>&1 | grep '^data: train:' | sed 's/^data: train: //')
    echo "first_fit buffer $buf: $line"
done
