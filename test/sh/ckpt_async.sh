#!/usr/bin/env bash
# Asynchronous, verifiable checkpoints (issue 23, part 1): checkpoint.async writes the same bytes
# as a synchronous save under every layout while training goes on; SIGKILL at random points of
# async saves always resumes bit-identically from the last complete checkpoint; a flipped byte is
# found by the manifest's checksums and the resume falls back to the previous complete step (or
# exits 2 when checkpoint.resume named the damaged one); the staging buffer is in the plan.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
SMALL="--set model.n_layer=2 --set model.d_model=64 --set model.d_ff=128 --set train.seq_len=32 --set train.global_batch_size=4 --set train.micro_batch_size=2 --set data.val_every=0"
# run CKDIR STEPS [more args]: train to STEPS with a checkpoint every 2 steps, keeping 3
run() {
    local ck=$1 steps=$2; shift 2
    $UST train $TMP/c.yaml $SMALL --set train.steps=$steps --set checkpoint.every=2 --set checkpoint.keep_last=3 \
        --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.metrics.jsonl" "$@"
}
same_step() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.safetensors" "$2/optimizer.safetensors"; }

# --- async writes what sync writes, one process and under layouts ------------------------------
run $TMP/sync/ck 8 >$TMP/o 2>&1 || fail sync_reference "$(tail -3 $TMP/o)"
out=$(run $TMP/async/ck 8 --set checkpoint.async=true 2>&1)
if same_step $TMP/sync/ck/step_8 $TMP/async/ck/step_8 && same_step $TMP/sync/ck/step_4 $TMP/async/ck/step_4 &&
   echo "$out" | grep -q "checkpoint step_2 committed (written in the background"; then
    pass async_checkpoints_equal_sync_ones
else fail async_checkpoints_equal_sync_ones "$(echo "$out" | tail -3)"; fi
for lay in "dp2z1:--set parallel.dp=2 --set optimizer.zero_stage=1" "tp2:--set parallel.tp=2" "pp2:--set parallel.pp=2"; do
    name=${lay%%:*}; sets=${lay#*:}
    for mode in false true; do
        scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL $sets --set train.steps=4 --set checkpoint.every=2 \
            --set checkpoint.async=$mode --set checkpoint.dir=$TMP/$name.$mode/ck \
            --set logging.metrics_file=$TMP/$name.$mode.jsonl >$TMP/$name.$mode.out 2>&1
    done
    plan=$(grep -o "staging buffer [0-9]* bytes of host memory (plan [0-9]*)" $TMP/$name.true.out)
    if same_step $TMP/$name.false/ck/step_4 $TMP/$name.true/ck/step_4 &&
       [ -n "$plan" ] && [ "$(echo "$plan" | grep -oE '[0-9]+' | sort -u | wc -l)" = 1 ]; then
        pass async_equals_sync_under_${name}_and_its_staging_is_the_plan
    else fail async_equals_sync_under_${name}_and_its_staging_is_the_plan "plan line '$plan': $(tail -2 $TMP/$name.true.out)"; fi
done
# the manifest is what its files are (an independent reader: Python's zlib)
if python3 - $TMP/async/ck/step_8 <<'EOF'
import json, os, sys, zlib
d = sys.argv[1]; m = json.load(open(os.path.join(d, "manifest.json"))); B = m["block_bytes"]
names = sorted(f["name"] for f in m["files"])
assert names == ["model.safetensors", "optimizer.safetensors", "state.json"], names
for f in m["files"]:
    b = open(os.path.join(d, f["name"]), "rb").read()
    assert len(b) == f["size"] and f["crc32"] == [zlib.crc32(b[i:i + B]) for i in range(0, len(b), B)], f["name"]
    if f["name"].endswith(".safetensors"):  # the header's CRC, then each tensor's in file order
        n = int.from_bytes(b[:8], "little"); h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
        spans = sorted(tuple(8 + n + o for o in t["data_offsets"]) for t in h.values())
        assert f["tensor_crc32"] == [zlib.crc32(b[:8 + n])] + [zlib.crc32(b[s:e]) for s, e in spans], f["name"]
assert m["step"] == 8 and m["layout"]["dp"] == 1 and m["job"]
EOF
then pass manifest_lists_every_file_with_its_size_and_crc32; else fail manifest_lists_every_file_with_its_size_and_crc32 "see above"; fi

# --- SIGKILL at random points of async saves ---------------------------------------------------
# Every step saves and the writer thread holds on for a random while after its first run, so most
# of the run is spent inside some async save; each trial kills at a random moment, resumes, and
# must end with the uninterrupted run's bytes.
run $TMP/ref12/ck 12 --set checkpoint.every=1 >$TMP/o 2>&1 || fail ref12 "$(tail -3 $TMP/o)"
bad=""
for trial in 1 2 3 4 5 6 7 8; do
    ck=$TMP/kill$trial/ck
    UST_FAULT_CKPT_SLEEP_MS=$((RANDOM % 150 + 50)) $UST train $TMP/c.yaml $SMALL --set train.steps=12 \
        --set checkpoint.every=1 --set checkpoint.keep_last=2 --set checkpoint.async=true \
        --set checkpoint.dir=$ck --set logging.metrics_file=$ck.m.jsonl >$TMP/k$trial.out 2>&1 &
    p=$!
    sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
    kill -9 $p 2>/dev/null; wait $p 2>/dev/null
    run $ck 12 --set checkpoint.every=1 --set checkpoint.keep_last=2 >$TMP/r$trial.out 2>&1 ||
        bad="$bad trial $trial: resume failed: $(tail -2 $TMP/r$trial.out);"
    same_step $TMP/ref12/ck/step_12 $ck/step_12 || bad="$bad trial $trial: differs ($(grep -o 'resuming from [^ ]*' $TMP/r$trial.out));"
    grep -q "warning" $TMP/r$trial.out && bad="$bad trial $trial: $(grep warning $TMP/r$trial.out | head -1);"
done
[ -z "$bad" ] && pass sigkill_during_async_saves_always_resumes_bit_identically || fail sigkill_during_async_saves_always_resumes_bit_identically "$bad"
# a multi-rank job killed whole (the launcher and its ranks) in the middle of an async save
DP2="--set parallel.dp=2 --set optimizer.zero_stage=1"
scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL $DP2 --set train.steps=12 --set checkpoint.every=12 \
    --set checkpoint.dir=$TMP/ref12dp/ck --set logging.metrics_file=$TMP/ref12dp.jsonl >$TMP/o 2>&1 || fail ref12dp "$(tail -3 $TMP/o)"
ck=$TMP/killdp/ck
UST_FAULT_CKPT_SLEEP_MS=800 scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 \
    --set optimizer.zero_stage=1 --set train.steps=12 --set checkpoint.every=1 --set checkpoint.async=true \
    --set checkpoint.dir=$ck --set logging.metrics_file=$ck.m.jsonl >$TMP/kdp.out 2>&1 &
p=$!
for _ in $(seq 300); do [ -e $ck/latest ] && break; sleep 0.1; done
sleep 0.4; pkill -9 -f "checkpoint.dir=$ck " # the launcher and both ranks (each in its own session)
wait $p 2>/dev/null
for _ in $(seq 100); do pgrep -f "checkpoint.dir=$ck " >/dev/null || break; sleep 0.1; done
out=$(scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 --set optimizer.zero_stage=1 \
    --set train.steps=12 --set checkpoint.every=1 --set checkpoint.dir=$ck --set logging.metrics_file=$ck.m.jsonl 2>&1)
if same_step $TMP/ref12dp/ck/step_12 $ck/step_12 && echo "$out" | grep -q "resuming from"; then
    pass a_killed_dp2_job_resumes_bit_identically_from_its_last_complete_async_save
else fail a_killed_dp2_job_resumes_bit_identically_from_its_last_complete_async_save "$(echo "$out" | tail -2)"; fi

# --- a damaged checkpoint: detected, the previous complete one is used --------------------------
cp -r $TMP/sync/ck $TMP/flip
python3 - $TMP/flip/step_8/model.safetensors <<'EOF'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); o = h["model.norm.weight"]["data_offsets"]
b[8 + n + o[0] + 5] ^= 0x04          # one bit of the final norm's weights
open(sys.argv[1], "wb").write(b)
EOF
out=$(run $TMP/flip 8 --set train.steps=8 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "warning: checkpoint .*flip/step_8: model.safetensors does not match its manifest: bytes \[.*) (tensor 'model.norm.weight') have another checksum.*falling back" &&
   echo "$out" | grep -q "resuming from .*flip/step_6" && same_step $TMP/sync/ck/step_8 $TMP/flip/step_8; then
    pass a_flipped_byte_is_detected_and_the_previous_checkpoint_resumes_to_the_same_model
else fail a_flipped_byte_is_detected_and_the_previous_checkpoint_resumes_to_the_same_model "exit $rc: $(echo "$out" | grep -E 'warn|error|resum' | head -3)"; fi
cp -r $TMP/sync/ck $TMP/flip2
printf '\x01' | dd of=$TMP/flip2/step_8/optimizer.safetensors bs=1 seek=9000 conv=notrunc 2>/dev/null
expect_exit a_damaged_checkpoint_named_by_resume_exits_2 2 "flip2/step_8: optimizer.safetensors does not match its manifest" -- \
    run $TMP/flip2 10 --set checkpoint.resume=$TMP/flip2/step_8
cp -r $TMP/sync/ck $TMP/onlyone; rm -rf $TMP/onlyone/step_4 $TMP/onlyone/step_6
truncate -s 100 $TMP/onlyone/step_8/model.safetensors
expect_exit a_damaged_checkpoint_with_nothing_before_it_exits_2 2 "no earlier complete checkpoint is in .*checkpoint.resume: none" -- \
    run $TMP/onlyone 10
cp -r $TMP/sync/ck $TMP/unsealed; rm $TMP/unsealed/step_8/manifest.json
expect_exit a_step_without_manifest_is_never_resumed_from 0 "resuming from .*unsealed/step_6" -- run $TMP/unsealed 8
expect_exit checkpoint_async_must_be_a_boolean 2 "checkpoint.async.*(true|false|boolean)" -- run $TMP/badasync 2 --set checkpoint.async=maybe
expect_exit checkpoint_async_without_a_dir_exits_2 2 "checkpoint.dir is empty \(checkpoint.async writes checkpoints there\)" -- \
    $UST train $TMP/c.yaml $SMALL --set checkpoint.async=true --set 'checkpoint.dir=""'
