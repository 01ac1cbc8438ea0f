#!/usr/bin/env bash
# Loss masks (llm.c shards of version 2 carry a target flag per token): the loss is the mean over
# the target tokens of the whole global batch, so a window without a target weighs nothing (not
# NaN) and the masked tokens are in neither the sum nor the denominator; the step's target count
# is in the metrics; every layout (dp/ZeRO, tp+sp, cp both layouts, pp 1f1b/zb/dualpipev, ep)
# and micro-batch split trains the one-process model; damaged or unknown shard versions are
# refused naming the file. Megatron datasets carry the mask as a PREFIX.mask sidecar: the same
# losses and target counts as the llm.c version 2 shards of the same tokens and mask.
. "$(dirname "$0")/../lib.sh"

M="python3 test/tools/masked_shards.py"
mkdir -p $TMP/chat $TMP/den
$M chat $TMP/chat 300 256 1500 && $M denom $TMP/den 300 16 || { fail loss_mask_data "writing the shards failed"; exit 0; }
cat >$TMP/llama.yaml <<EOT
run:   {name: mask-llama, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {seq_len: 32, micro_batch_size: 1, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/chat/train_*.bin", val: "$TMP/chat/val_*.bin", val_every: 2, val_steps: 2}
EOT

# first_loss TAG SETS...: the step-1 loss and target_tokens of a one-step run of $TMP/llama.yaml
first() {
    local tag=$1; shift
    $UST train $TMP/llama.yaml --set train.steps=1 --set checkpoint.dir=$TMP/$tag/ckpt --set data.val=null \
        --set logging.metrics_file=$TMP/$tag/m.jsonl "$@" >$TMP/$tag.log 2>&1 || { tail -2 $TMP/$tag.log; return 1; }
    python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(r['loss'], r['target_tokens'])" $TMP/$tag/m.jsonl
}
# The denominator: A = [window X, every token a target; a window of no target], B = [X, X]. The
# mean over A's targets is X's mean loss, B's too; counting A's masked tokens would halve it.
DEN=(--set train.seq_len=16 --set train.global_batch_size=2)
a=$(first den_a "${DEN[@]}" --set "data.train=$TMP/den/a_*.bin") &&
    b=$(first den_b "${DEN[@]}" --set "data.train=$TMP/den/b_*.bin") &&
    python3 - "$a" "$b" <<'EOT' && pass loss_mask_mean_over_targets_only || fail loss_mask_mean_over_targets_only "A '$a' B '$b'"
import sys
(la, na), (lb, nb) = (map(float, s.split()) for s in sys.argv[1:3])
assert na == 16 and nb == 32, (na, nb)
assert abs(la - lb) <= 1e-5 * abs(lb), (la, lb)  # one window's losses summed in another order
EOT
# a micro-batch (here a whole dp rank's share) without a target contributes zero, not NaN
c=$(scripts/ustrun --nproc-per-node 2 $UST train $TMP/llama.yaml --set train.steps=1 --set checkpoint.dir=$TMP/den_c/ckpt \
        --set data.val=null --set logging.metrics_file=$TMP/den_c/m.jsonl "${DEN[@]}" --set "data.train=$TMP/den/a_*.bin" \
        --set parallel.dp=2 >$TMP/den_c.log 2>&1 &&
    python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(r['loss'], r['target_tokens'])" $TMP/den_c/m.jsonl)
[ -n "$c" ] && python3 -c "import sys; a,c=[float(x.split()[0]) for x in sys.argv[1:3]]; assert abs(a-c) <= 1e-5*abs(a)" "$a" "$c" &&
    pass loss_mask_empty_microbatch_adds_zero || fail loss_mask_empty_microbatch_adds_zero "one process '$a', dp=2 '$c': $(tail -2 $TMP/den_c.log)"

# target_tokens is the count of the step's flags (windows 0..3 of the stream: no shuffle)
n=$(first count) && want=$(python3 - $TMP/chat/train_000.bin <<'EOT'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<3i", b[:12])[2]
bits = b[1024 + 2 * n:]
flag = lambda i: (bits[i >> 3] >> (i & 7)) & 1
print(sum(flag(k * 32 + p) for k in range(4) for p in range(1, 33)))
EOT
) && [ "${n#* }" = "$want" ] && pass loss_mask_target_tokens_metric || fail loss_mask_target_tokens_metric "metrics '$n', flags say $want"

# validation over masked shards counts their targets only: finite
$UST train $TMP/llama.yaml --set train.steps=2 --set checkpoint.dir=$TMP/val/ckpt --set logging.metrics_file=$TMP/val/m.jsonl >$TMP/val.log 2>&1 &&
    grep -q '"val_loss":[0-9]' $TMP/val/m.jsonl && pass loss_mask_validation || fail loss_mask_validation "$(tail -2 $TMP/val.log)"

# every layout and micro-batch split trains the one-process model on the masked data
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 32}}/' $TMP/llama.yaml >$TMP/moe.yaml
sed -e 's/n_layer: 2/n_layer: 4/' -e 's/global_batch_size: 4/global_batch_size: 8/' $TMP/llama.yaml >$TMP/dpv.yaml
EQ="python3 test/tools/equiv.py --steps 4 --set data.val=null"
$EQ --name _mask --config $TMP/llama.yaml --layout "dp=2 zero=0" --layout "dp=2 zero=3" --layout "mb=2" \
    --layout "tp=2 sp=true" --layout "cp=2" --layout "cp=2 parallel.cp_layout=contiguous parallel.cp_comm=allgather" \
    --layout "pp=2" --layout "pp=2 sched=zb"
$EQ --name _mask_dualpipev --config $TMP/dpv.yaml --layout "pp=2 vpp=2 sched=dualpipev"
$EQ --name _mask_moe --config $TMP/moe.yaml --layout "ep=2 dp=2"
$EQ --name _mask_resume --config $TMP/llama.yaml --save-layout "dp=2 zero=3" --resume-at 2 --layout "tp=2"

# refused shards: a mask cut short, a version this reader does not know
python3 - $TMP/chat/train_000.bin $TMP/bad <<'EOT'
import os, sys
b = open(sys.argv[1], "rb").read()
os.makedirs(sys.argv[2], exist_ok=True)
open(sys.argv[2] + "/cut_000.bin", "wb").write(b[:-3])
open(sys.argv[2] + "/v3_000.bin", "wb").write(b[:4] + (3).to_bytes(4, "little") + b[8:])
EOT
expect_exit loss_mask_cut_mask_refused 2 "cut_000.bin: truncated shard: header says [0-9]+ tokens and their target mask" -- \
    $UST train $TMP/llama.yaml --set "data.train=$TMP/bad/cut_*.bin" --set checkpoint.dir=$TMP/x/ckpt
expect_exit loss_mask_unknown_version_refused 2 "v3_000.bin: unsupported llm.c shard version 3 \(expected 1, or 2 with a target mask\)" -- \
    $UST train $TMP/llama.yaml --set "data.train=$TMP/bad/v3_*.bin" --set checkpoint.dir=$TMP/x/ckpt
# Megatron datasets with PREFIX.mask: the llm.c run's losses and target counts exactly (the same
# windows of the same stream), also packed first-fit and under dp=2 (the layout's equivalence)
mkdir -p $TMP/meg && $M megatron $TMP/chat $TMP/meg 256 || fail loss_mask_megatron_data "writing the Megatron copy failed"
MEG=(--set data.format=megatron --set "data.train=$TMP/meg/train_*.bin" --set "data.val=$TMP/meg/val_*.bin")
# figures TAG LAUNCH... -- SETS...: each step's loss, val_loss and target_tokens of a 4-step run
figures() {
    local tag=$1 pre=()
    shift
    while [ "$1" != -- ]; do pre+=("$1"); shift; done
    shift
    "${pre[@]}" train $TMP/llama.yaml --set train.steps=4 --set checkpoint.dir=$TMP/$tag/ckpt \
        --set logging.metrics_file=$TMP/$tag/m.jsonl "$@" >$TMP/$tag.log 2>&1 &&
        grep -o '"loss":[0-9.]*\|"val_loss":[0-9.]*\|"target_tokens":[0-9]*' $TMP/$tag/m.jsonl | tr '\n' ' '
}
for pk in concat first_fit; do
    a=$(figures meg_llmc_$pk $UST -- --set data.packing=$pk) && b=$(figures meg_$pk $UST -- --set data.packing=$pk "${MEG[@]}") &&
        [ -n "$a" ] && [ "$a" = "$b" ] && echo "$a" | grep -q '"target_tokens":[0-9]' && ! echo "$a" | grep -q '"target_tokens":128 ' &&
        pass loss_mask_megatron_equals_llmc_v2_$pk || fail loss_mask_megatron_equals_llmc_v2_$pk "llmc '$a' megatron '$b' $(tail -2 $TMP/meg_$pk.log)"
done
c=$(figures meg_dp2 scripts/ustrun --nproc-per-node 2 $UST -- "${MEG[@]}" --set parallel.dp=2) &&
    python3 - "$(figures meg_llmc_concat2 $UST --)" "$c" <<'EOT' && pass loss_mask_megatron_dp2_equals_one_process || fail loss_mask_megatron_dp2_equals_one_process "$c $(tail -2 $TMP/meg_dp2.log)"
import sys
a, b = (s.split() for s in sys.argv[1:3])
assert len(a) == len(b) == 10, (a, b)  # 4 losses, 4 target counts, 2 val_loss
for x, y in zip(a, b):
    kx, vx = x.split(":"); ky, vy = y.split(":")
    assert kx == ky and abs(float(vx) - float(vy)) <= 1e-5 * abs(float(vx)), (x, y)
EOT
# refused masks: another token count, a foreign file, a directory; named with the value
python3 - $TMP/meg $TMP/megbad <<'EOT'
import os, shutil, struct, sys
src, dst = sys.argv[1:3]
for name in ("count", "magic", "dir", "short"):
    os.makedirs(dst + "/" + name, exist_ok=True)
    for ext in ("bin", "idx"):
        shutil.copy(src + "/train_000." + ext, dst + "/" + name + "/train_000." + ext)
m = open(src + "/train_000.mask", "rb").read()
n = struct.unpack("<Q", m[16:24])[0]
open(dst + "/count/train_000.mask", "wb").write(m[:16] + struct.pack("<Q", n + 9) + m[24:])
open(dst + "/magic/train_000.mask", "wb").write(b"NOTMASK\0" + m[8:])
os.makedirs(dst + "/dir/train_000.mask")
open(dst + "/short/train_000.mask", "wb").write(m[:5])
EOT
for bad in count magic dir short; do
    want="train_000.mask: a mask of [0-9]+ tokens in [0-9]+ bytes, but .*train_000.bin holds [0-9]+ tokens"
    [ $bad = magic ] && want='train_000.mask: not a target mask \(read: magic "USTMASK", version 1'
    [ $bad = dir ] && want="train_000.mask: .*directory"
    [ $bad = short ] && want="train_000.mask: not a target mask \(5 bytes, shorter than its 24-byte header\)"
    expect_exit loss_mask_megatron_mask_${bad}_refused 2 "$want" -- \
        $UST train $TMP/llama.yaml --set data.format=megatron --set "data.train=$TMP/megbad/$bad/train_*.bin" \
        --set data.val=null --set checkpoint.dir=$TMP/x/ckpt
done
exit 0
