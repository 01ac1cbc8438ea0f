#!/usr/bin/env bash
# Data parallelism and ZeRO in the equivalence harness: every layout trains the same model as one
# process (per-step losses and final weights), resumes across layouts, and a deliberate fault
# (one rank's gradients dropped) is caught.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
for arch in llama gpt2; do
    kv=2; [ $arch = gpt2 ] && kv=4
    cat >$TMP/$arch.yaml <<EOT
run:   {name: equiv-$arch, seed: 7}
model: {arch: $arch, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: $kv, d_ff: 128, vocab_size: 512, max_seq_len: 64}
train: {seq_len: 32, micro_batch_size: 1, global_batch_size: 12}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
EOT
done
EQ="python3 test/tools/equiv.py --steps 10"

layouts=()
for dp in 2 3 4; do for z in 0 1 2 3; do layouts+=(--layout "dp=$dp zero=$z"); done; done
$EQ --name _llama --config $TMP/llama.yaml "${layouts[@]}"
$EQ --name _gpt2_tied --config $TMP/gpt2.yaml --layout "dp=2 zero=0" --layout "dp=3 zero=3" \
    --layout "dp=4 zero=2" --layout "dp=2 zero=1 train.recompute=full"
# dp=2 x gradient accumulation 2 against dp=1 x gradient accumulation 4
$EQ --name _accum --config $TMP/llama.yaml --set train.global_batch_size=8 --set train.micro_batch_size=2 \
    --layout "dp=2"
# ZeRO-3 with the vocabulary tables in row chunks of 100 rows (6 chunks, the last shorter: the
# embedding looks up chunk by chunk, the head's logits come in column blocks whose log-sum-exp is
# merged, a tied head gathers the table's chunks again): tied and untied, with tp/sp, pp (the
# tied copy), zero-bubble and document masking
V="parallel.zero3_vocab_chunk_rows=100"
$EQ --name _z3chunks_gpt2_tied --config $TMP/gpt2.yaml --layout "dp=2 zero=3 $V" --layout "dp=4 zero=3 $V" \
    --layout "dp=2 tp=2 sp=true zero=3 $V" --layout "dp=2 pp=2 zero=3 $V"
$EQ --name _z3chunks_gpt2_docs --config $TMP/gpt2.yaml --set data.doc_mask=true --layout "dp=2 zero=3 $V"
$EQ --name _z3chunks_llama --config $TMP/llama.yaml --layout "dp=2 zero=3 $V" --layout "dp=4 zero=3 $V" \
    --layout "dp=2 tp=2 zero=3 $V" --layout "dp=2 pp=2 zero=3 sched=zb $V"
# the harness itself: one rank's gradients dropped must be detected
$EQ --name _fault --config $TMP/llama.yaml --expect-fail --env UST_FAULT_DP_DROP_GRADS_RANK=1 \
    --layout "dp=2 zero=0" --layout "dp=4 zero=3" --layout "dp=2 zero=3 $V"
# save under dp=4 ZeRO-3, resume under dp=2 ZeRO-1 and under one process
$EQ --name _llama --config $TMP/llama.yaml --save-layout "dp=4 zero=3" --resume-at 5 \
    --layout "dp=2 zero=1" --layout "dp=1 zero=0"
$EQ --name _gpt2 --config $TMP/gpt2.yaml --save-layout "dp=1 zero=0" --resume-at 5 \
    --layout "dp=3 zero=2"
# a checkpoint of vocabulary chunks (several slices of a tensor per rank) resumes whole, and back
$EQ --name _z3chunks --config $TMP/gpt2.yaml --save-layout "dp=2 zero=3 $V" --resume-at 5 \
    --layout "dp=1 zero=0"
$EQ --name _z3chunks --config $TMP/llama.yaml --save-layout "dp=1 zero=0" --resume-at 5 \
    --layout "dp=2 tp=2 zero=3 $V"
exit 0
