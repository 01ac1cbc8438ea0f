#!/usr/bin/env bash
# Hardening of checkpoints, shards and stops (issue 18): two jobs on one checkpoint directory,
# safetensors whose offsets alias or shift, a state.json that lies, shards changed or cut while a
# run reads them, a file-size limit, FIFOs and directories where files belong, a stop before the
# first step and with checkpoint.every 0, and a rank whose disk fails. Every case checks the exit
# code, that the message names the file (or rank), and that the existing checkpoint is intact.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
SMALL="--set model.n_layer=2 --set model.d_model=64 --set model.d_ff=128 --set train.seq_len=32 --set train.global_batch_size=4 --set train.micro_batch_size=2"
# run CKDIR STEPS [more args]: train to STEPS with a checkpoint every 2 steps
run() {
    local ck=$1 steps=$2; shift 2
    $UST train $TMP/c.yaml $SMALL --set train.steps=$steps --set checkpoint.every=2 \
        --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.metrics.jsonl" "$@"
}
# args CKDIR STEPS: the same as `run`'s, for a run started in the background as $UST itself
args() { echo "train $TMP/c.yaml $SMALL --set train.steps=$2 --set checkpoint.every=2 --set checkpoint.dir=$1 --set logging.metrics_file=$1.metrics.jsonl"; }
sums() { (cd "$1" && cat latest && find step_* -type f | sort | xargs sha256sum); }
# intact NAME CKDIR BEFORE: the checkpoints are byte for byte what they were, no temporaries
intact() {
    local after
    after=$(sums "$2" 2>&1)
    if [ "$after" = "$3" ] && ! ls -d "$2"/.tmp_step_* >/dev/null 2>&1; then pass "$1"
    else fail "$1" "$(ls -a "$2" | tr '\n' ' ')"; fi
}
# wait_for FILE PATTERN: until FILE has a line matching PATTERN (at most 120 s)
wait_for() {
    for _ in $(seq 1200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
# bounded CKDIR STEPS [more args]: `run` as $UST itself under a 60 s limit: a hang is a failure,
# not a stuck suite
bounded() { local ck=$1 steps=$2; shift 2; timeout -k 5 60 $UST $(args $ck $steps) "$@"; }

# --- item 1: one job per checkpoint directory --------------------------------------------------
ck=$TMP/two/ck
UST_FAULT_CKPT_SLEEP_MS=3000 $UST $(args $ck 6) >$TMP/a.out 2>&1 &
a=$!
wait_for $ck.metrics.jsonl '"step":1' || fail second_job_refused "the first job did not start: $(tail -2 $TMP/a.out)"
expect_exit second_job_on_a_checkpoint_dir_is_refused_naming_the_holder 2 \
    "checkpoint.dir .*/two/ck is in use by another job \(host $(hostname), pid $a, started .*\)" -- \
    run $ck 6 --set "logging.metrics_file=$TMP/b.jsonl"
wait $a; rc=$?
out=$(run $ck 6 2>&1); rc2=$?
if [ $rc = 0 ] && [ $rc2 = 0 ] && echo "$out" | grep -q "resuming from .*step_6"; then
    pass first_job_finishes_and_its_checkpoint_resumes
else
    fail first_job_finishes_and_its_checkpoint_resumes "first exit $rc, rerun exit $rc2: $(echo "$out" | tail -2)"
fi
# a holder killed with SIGKILL does not block the next job (the kernel drops the lock)
ck=$TMP/killed/ck
UST_FAULT_CKPT_SLEEP_MS=30000 $UST $(args $ck 4) >$TMP/k.out 2>&1 &
k=$!
wait_for $ck.metrics.jsonl '"step":1' && sleep 0.5
kill -9 $k; wait $k 2>/dev/null
expect_exit a_killed_holder_never_blocks_the_next_job 0 "done: 4 steps" -- run $ck 4
# multi-rank: rank 0 holds the lock for the job
ck=$TMP/mr/ck
UST_FAULT_CKPT_SLEEP_MS=3000 scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 \
    --set train.steps=4 --set checkpoint.every=2 --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.metrics.jsonl" >$TMP/mr.out 2>&1 &
m=$!
wait_for $ck.metrics.jsonl '"step":1'
expect_exit second_job_refused_while_a_multi_rank_job_holds_the_dir 2 "is in use by another job" -- \
    run $ck 4 --set "logging.metrics_file=$TMP/mr2.jsonl"
wait $m && pass multi_rank_holder_finishes || fail multi_rank_holder_finishes "$(tail -3 $TMP/mr.out)"

# a refused run writes nothing into the checkpoint directory: .lock (the holder record) keeps its
# bytes and mtime through refusals found after the lock is taken (a bad data path, a model that
# does not fit the checkpoint, a tensorboard_dir that is a file) and through an eval
ck=$TMP/refused/ck
run $ck 2 >$TMP/o 2>&1 || fail refused_setup "$(tail -2 $TMP/o)"
touch -d '2001-01-01 00:00:00' $ck/.lock
lock_before="$(sha256sum <$ck/.lock) $(stat -c %y $ck/.lock)"
ls_before=$(ls -a $ck)
expect_exit refused_bad_data_path 2 "nonexistent" -- run $ck 4 --set "data.train=$TMP/nonexistent/train_*.bin"
expect_exit refused_model_mismatch 2 "" -- run $ck 4 --set model.n_layer=3
expect_exit refused_tb_dir_is_a_file 2 "tensorboard_dir" -- run $ck 4 --set logging.tensorboard_dir=$TMP/c.yaml
$UST eval $ck --data "$TMP/data/val_*.bin" --steps 1 >$TMP/ev.out 2>&1 || fail refused_eval_runs "$(tail -2 $TMP/ev.out)"
if [ "$(sha256sum <$ck/.lock) $(stat -c %y $ck/.lock)" = "$lock_before" ] && [ "$(ls -a $ck)" = "$ls_before" ]; then
    pass refused_runs_leave_the_lock_file_as_it_was
else fail refused_runs_leave_the_lock_file_as_it_was "$(stat -c %y $ck/.lock): $(cat $ck/.lock)"; fi
expect_exit a_started_run_records_its_holder 0 "step  *4/4" -- run $ck 4
grep -q "pid [0-9]*, started" $ck/.lock && [ "$(stat -c %Y $ck/.lock)" -gt 1000000000 ] &&
    [ "$(sha256sum <$ck/.lock) $(stat -c %y $ck/.lock)" != "$lock_before" ] &&
    pass started_run_rewrites_the_holder || fail started_run_rewrites_the_holder "$(cat $ck/.lock)"

# --- item 2: safetensors whose tensors alias, shift or leave gaps ------------------------------
ck=$TMP/st/ck
run $ck 2 >$TMP/o 2>&1 || fail safetensors_setup "$(tail -3 $TMP/o)"
# corrupt MODE: rewrite step_2/model.safetensors (a copy of the original per case)
cp $ck/step_2/model.safetensors $TMP/orig.safetensors
corrupt() {
    python3 - "$1" $TMP/orig.safetensors $ck/step_2/model.safetensors <<'EOF'
import json, struct, sys
mode, src, dst = sys.argv[1:]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
names = [k for k in h if k != "__metadata__"]
if mode == "alias":   # the second layer's q_proj aliases the first's
    h["model.layers.1.self_attn.q_proj.weight"]["data_offsets"] = h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]
if mode == "shift":   # every tensor one byte later, one junk byte in front
    for k in names: h[k]["data_offsets"] = [o + 1 for o in h[k]["data_offsets"]]
    data = b"\0" + data
if mode == "nul":     # a dtype with a NUL inside: read up to the NUL it would be F32
    h[names[0]]["dtype"] = "F32\u0000junk"
if mode in ("alias", "shift", "nul"):
    hj = json.dumps(h).encode(); hj += b" " * (-len(hj) % 8)
    out = struct.pack("<Q", len(hj)) + hj + data
if mode == "short":   # the header length one byte short (the header ends in padding)
    hj = b[8:8 + n]
    if not hj.endswith(b" "): hj += b" " * 8
    out = struct.pack("<Q", len(hj) - 1) + hj + data
open(dst, "wb").write(out)
EOF
    python3 test/tools/reseal.py $ck/step_2 # past the manifest: the reader's own checks
}
for mode in alias shift short; do
    corrupt $mode
    before=$(sums $ck)
    expect_exit safetensors_${mode}_offsets_exit_2_naming_file_and_tensor 2 \
        "step_2/model.safetensors: (tensor '.*' (data_offsets|starts at)|the tensors cover)" -- run $ck 4
    intact safetensors_${mode}_leaves_the_checkpoint_as_it_was $ck "$before"
done
corrupt nul
before=$(sums $ck)
expect_exit safetensors_nul_in_a_dtype_exits_2 2 "step_2/model.safetensors: safetensors header holds a NUL character" -- run $ck 4
intact safetensors_nul_leaves_the_checkpoint_as_it_was $ck "$before"
cp $TMP/orig.safetensors $ck/step_2/model.safetensors
python3 test/tools/reseal.py $ck/step_2

# --- item 3: state.json must agree with its directory and the data position --------------------
state=$ck/step_2/state.json
cp $state $TMP/state.orig
lie() { python3 -c "
import json, sys; s = json.load(open('$TMP/state.orig')); s.update(json.loads(sys.argv[1])); json.dump(s, open('$state', 'w'))" "$1"
    python3 test/tools/reseal.py $ck/step_2; }
lie '{"step": 9007199254740992}'
expect_exit state_step_2_pow_53_exits_2 2 "state.json: missing or invalid step / sample_index \(step 9\.007.*2\^53" -- run $ck 4
lie '{"step": 1, "sample_index": 4}'
expect_exit state_step_inside_another_step_dir_exits_2 2 "says step 1, but the directory is step 2" -- run $ck 4
lie '{"sample_index": 12345}'
expect_exit state_sample_index_inconsistent_exits_2 2 "sample_index 12345 is not what step 2 implies" -- run $ck 4
cp $TMP/state.orig $state
python3 test/tools/reseal.py $ck/step_2
expect_exit checkpoint_beyond_train_steps_exits_2 2 "is at step 2, beyond train.steps = 1" -- run $ck 1
expect_exit restored_state_resumes 0 "resuming from .*step_2" -- run $ck 4

# --- items 7 and 13: FIFOs, directories where files belong --------------------------------------
ck=$TMP/fifo/ck
run $ck 2 >$TMP/o 2>&1 || fail fifo_setup "$(tail -3 $TMP/o)"
before=$(sums $ck)
mv $ck/latest $TMP/latest.orig
mkfifo $ck/latest
expect_exit fifo_as_latest_exits_2 2 "latest is a FIFO" -- bounded $ck 4
rm $ck/latest; mkdir $ck/latest
out=$(bounded $ck 4 2>&1); rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q "latest is a directory" && ! echo "$out" | grep -q "step *1/"; then
    pass latest_directory_exits_2_before_training
else fail latest_directory_exits_2_before_training "exit $rc: $(echo "$out" | tail -2)"; fi
rmdir $ck/latest; mv $TMP/latest.orig $ck/latest
for f in state.json model.safetensors; do
    mv $ck/step_2/$f $TMP/$f.orig; mkfifo $ck/step_2/$f
    expect_exit fifo_as_${f}_exits_2 2 "$f(: not a regular file \(a FIFO\)| is a FIFO, not a regular file)" -- bounded $ck 4
    rm $ck/step_2/$f; mv $TMP/$f.orig $ck/step_2/$f
done
intact fifos_leave_the_checkpoint_as_it_was $ck "$before"
mkdir -p $TMP/fdata; cp $TMP/data/train_000.bin $TMP/fdata/; mkfifo $TMP/fdata/train_001.bin
expect_exit fifo_as_data_shard_exits_2 2 "train_001.bin: not a regular file \(a FIFO\)" -- \
    bounded $TMP/fifo2/ck 2 --set "data.train=$TMP/fdata/train_*.bin"
mkfifo $TMP/cfg.fifo.yaml
expect_exit fifo_as_metrics_file_exits_2 2 "metrics file .*: not a regular file \(a FIFO\)" -- \
    bounded $TMP/fifo3/ck 2 --set "logging.metrics_file=$TMP/cfg.fifo.yaml"
# a FIFO for the shards' meta.json: every reader (data checks, eval.tasks' default tokenizer, the
# tokenizer a checkpoint records) goes through data_meta_read's regular-file open: exit 2 naming
# it, never a wait for a writer (timeout's 124 when one blocks)
mkdir -p $TMP/mdata; cp $TMP/data/train_000.bin $TMP/mdata/; mkfifo $TMP/mdata/meta.json
printf '%s\n' '{"context": "a", "choices": ["b", "c"], "label": 1}' >$TMP/mc.jsonl
MT=(--set "data.train=$TMP/mdata/train_*.bin" --set "eval.tasks=[{name: mc, path: $TMP/mc.jsonl, every: 2}]")
expect_exit fifo_as_meta_json_train_with_eval_tasks_exits_2 2 \
    "eval.tasks: no eval.tokenizer, and data.train's .*mdata/meta.json: not a regular file \(a FIFO\)" -- \
    bounded $TMP/fifo4/ck 2 "${MT[@]}"
expect_exit fifo_as_meta_json_validate_exits_2 2 "mdata/meta.json: not a regular file \(a FIFO\)" -- \
    timeout -k 5 60 $UST validate $TMP/c.yaml "${MT[@]}"
expect_exit fifo_as_meta_json_train_exits_2 2 "mdata/meta.json: not a regular file \(a FIFO\)" -- \
    bounded $TMP/fifo5/ck 2 --set "data.train=$TMP/mdata/train_*.bin"
[ ! -e $TMP/fifo4 ] && pass fifo_as_meta_json_eval_tasks_refused_before_any_work ||
    fail fifo_as_meta_json_eval_tasks_refused_before_any_work "$(ls -R $TMP/fifo4 2>&1 | tr '\n' ' ')"

# --- item 5: a shard rewritten or cut while the run reads it -----------------------------------
# (the run's shards are copies; steps long enough that it is still reading when they change)
for how in rewrite truncate; do
    d=$TMP/live_$how; mkdir -p $d; cp $TMP/data/train_*.bin $d/
    ck=$TMP/live_$how/ck
    $UST $(args $ck 400) --set "data.train=$d/train_*.bin" >$TMP/live.out 2>&1 &
    p=$!
    wait_for $ck.metrics.jsonl '"step":3'
    for f in $d/train_*.bin; do
        if [ $how = rewrite ]; then # the same size, out-of-vocabulary ids from byte 4096 on
            python3 -c "
import os, sys; f = open(sys.argv[1], 'r+b'); n = os.path.getsize(sys.argv[1]); f.seek(4096); f.write(b'\xff' * (n - 4096))" $f
        else
            truncate -s 2048 $f
        fi
    done
    timeout 120 tail --pid=$p -f /dev/null || kill -9 $p; wait $p; rc=$?
    if [ $rc = 1 ] && grep -qE "data shard .*/live_$how/train_00[0-9].bin (changed while the run reads it|.*outside the model's vocabulary)|live_$how/train_00[0-9].bin: the file shrank" $TMP/live.out; then
        pass shard_${how}_during_the_run_exits_1_naming_the_shard
    else
        fail shard_${how}_during_the_run_exits_1_naming_the_shard "exit $rc: $(tail -2 $TMP/live.out)"
    fi
    # the run may have written a newer checkpoint before it read the change; every one is whole
    if ! ls -d $ck/.tmp_step_* >/dev/null 2>&1 && $UST export $ck --to hf $TMP/exp_$how >/dev/null 2>&1; then
        pass shard_${how}_leaves_the_last_checkpoint_whole
    else
        fail shard_${how}_leaves_the_last_checkpoint_whole "$(ls -a $ck)"
    fi
done

# --- item 6: a file-size limit smaller than a checkpoint ----------------------------------------
ck=$TMP/fsize/ck
run $ck 2 >$TMP/o 2>&1 || fail fsize_setup "$(tail -3 $TMP/o)"
before=$(sums $ck)
big=$(stat -c %s $ck/step_2/optimizer.safetensors)
out=$(bash -c "ulimit -f $((big / 1024 / 2)); exec $UST train $TMP/c.yaml $SMALL --set train.steps=4 --set checkpoint.every=2 --set checkpoint.dir=$ck --set logging.metrics_file=$TMP/fsize.jsonl" 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q "checkpoint at step 4 failed: .*File too large"; then
    pass file_size_limit_gives_efbig_like_a_full_disk
else fail file_size_limit_gives_efbig_like_a_full_disk "exit $rc: $(echo "$out" | tail -2)"; fi
intact file_size_limit_keeps_the_old_checkpoint $ck "$before"

# --- items 14 and 15: stops --------------------------------------------------------------------
ck=$TMP/early/ck
UST_FAULT_SETUP_SLEEP_MS=3000 $UST $(args $ck 4) >$TMP/early.out 2>&1 &
p=$!
# the signal goes once the process catches SIGTERM (bit 15 of SigCgt), not after a fixed sleep: a
# loaded machine can take longer than that to get there
for _ in $(seq 600); do
    m=$(awk '/^SigCgt:/ {print $2}' /proc/$p/status 2>/dev/null)
    [ -n "$m" ] && (((0x$m >> 14) & 1)) && break
    sleep 0.1
done
kill -TERM $p; wait $p; rc=$?
if [ $rc = 0 ] && grep -q "before the first step" $TMP/early.out && ! ls $ck/step_* >/dev/null 2>&1; then
    pass stop_before_the_first_step_exits_0_without_a_checkpoint
else fail stop_before_the_first_step_exits_0_without_a_checkpoint "exit $rc: $(tail -2 $TMP/early.out)"; fi
ck=$TMP/every0/ck
$UST train $TMP/c.yaml $SMALL --set train.steps=400 --set checkpoint.every=0 --set "checkpoint.dir=$ck" \
    --set "logging.metrics_file=$ck.metrics.jsonl" >$TMP/e0.out 2>&1 &
p=$!
wait_for $ck.metrics.jsonl '"step":2'
kill -TERM $p; wait $p; rc=$?
s=$(cat $ck/latest 2>/dev/null)
if [ $rc = 0 ] && [ -n "$s" ] && [ -f $ck/$s/state.json ] && grep -q "checkpoint written" $TMP/e0.out; then
    pass sigterm_with_every_0_writes_a_checkpoint
else fail sigterm_with_every_0_writes_a_checkpoint "exit $rc, latest '$s': $(tail -2 $TMP/e0.out)"; fi

# --- item 21: a disk-write failure on rank 1 reaches rank 0's message ---------------------------
ck=$TMP/r1/ck
scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 --set optimizer.zero_stage=1 \
    --set train.steps=2 --set checkpoint.every=2 --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.m.jsonl" >$TMP/o 2>&1 ||
    fail rank1_disk_setup "$(tail -3 $TMP/o)"
before=$(sums $ck)
out=$(UST_FAULT_CKPT_WRITE_ERRNO=28 UST_FAULT_CKPT_WRITE_RANK=1 scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL \
    --set parallel.dp=2 --set optimizer.zero_stage=1 --set train.steps=4 --set checkpoint.every=2 --set "checkpoint.dir=$ck" \
    --set "logging.metrics_file=$ck.m2.jsonl" 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q "\[rank 0\].*checkpoint at step 4 failed: rank 1 failed to write its part: .*No space left on device" &&
   ! echo "$out" | grep -q "member process has died"; then
    pass rank1_disk_failure_reason_reaches_rank_0
else fail rank1_disk_failure_reason_reaches_rank_0 "exit $rc: $(echo "$out" | grep -i error | head -3)"; fi
intact rank1_disk_failure_removes_the_partial_step $ck "$before"

# --- the tools: export and generate read only a checkpoint that verifies, and nothing writes
# into a checkpoint's step (export's OUT, checkpoint.dir, data prep/demo) ----------------------
ck=$TMP/tools/ck
run $ck 4 >$TMP/o 2>&1 || fail tools_setup "$(tail -3 $TMP/o)"
$UST export $ck/step_2 --to hf $TMP/tools/hf2 >/dev/null 2>&1 || fail tools_setup "export of step_2 failed"
cp $ck/step_4/model.safetensors $TMP/tools/m4
python3 - $ck/step_4/model.safetensors <<'PYEOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-100] ^= 0x40; open(p, "wb").write(b)
PYEOF
before=$(sums $ck)
expect_exit export_of_a_damaged_step_exits_2 2 "export: checkpoint .*step_4: model.safetensors does not match its manifest" -- \
    $UST export $ck/step_4 --to hf $TMP/tools/hf-bad
[ ! -e $TMP/tools/hf-bad ] && pass export_of_a_damaged_step_writes_nothing || fail export_of_a_damaged_step_writes_nothing "$(ls $TMP/tools/hf-bad)"
out=$($UST export $ck --to hf $TMP/tools/hf 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "warning: export: checkpoint .*step_4: .*does not match its manifest.*; reading the previous" &&
   echo "$out" | grep -q "exported .*step_2 to" && cmp -s $TMP/tools/hf/model.safetensors $TMP/tools/hf2/model.safetensors; then
    pass export_of_a_checkpoint_dir_falls_back_to_the_newest_step_that_verifies
else fail export_of_a_checkpoint_dir_falls_back_to_the_newest_step_that_verifies "exit $rc: $(echo "$out" | tail -2)"; fi
expect_exit generate_from_a_damaged_step_exits_2 2 "generate: checkpoint .*step_4: model.safetensors does not match its manifest" -- \
    $UST generate $ck/step_4 --prompt hi --max-new-tokens 2
expect_exit generate_from_a_checkpoint_dir_falls_back 0 "reading the previous complete checkpoint" -- \
    $UST generate $ck --prompt hi --max-new-tokens 2
expect_exit eval_of_a_damaged_step_exits_2 2 "step_4: model.safetensors does not match its manifest" -- \
    $UST eval $ck/step_4 --data "$TMP/data/val_*.bin" --steps 1
expect_exit eval_of_a_checkpoint_dir_falls_back 0 "eval: checkpoint .*step_2$" -- \
    $UST eval $ck --data "$TMP/data/val_*.bin" --steps 1
# export's OUT: the step, a directory inside it (through ..), the checkpoint directory itself
expect_exit export_into_the_step_it_reads_exits_2 2 "output .*step_2 is the ustrain checkpoint step" -- \
    $UST export $ck/step_2 --to hf $ck/step_2
expect_exit export_inside_a_step_exits_2 2 "output .* is inside the ustrain checkpoint step .*step_4" -- \
    $UST export $ck/step_2 --to hf $ck/step_4/../step_4/hf/x
expect_exit export_into_the_checkpoint_dir_exits_2 2 "output .*ck is a ustrain checkpoint directory" -- \
    $UST export $ck/step_2 --to hf $ck
expect_exit train_with_checkpoint_dir_inside_a_step_exits_2 2 "checkpoint.dir .*step_2/ck2 is inside the ustrain checkpoint step" -- \
    run $ck/step_2/ck2 2 --set logging.metrics_file=$TMP/tools/ck2.jsonl
echo text >$TMP/tools/t.txt
expect_exit data_prep_into_a_step_exits_2 2 "data prep: --out .* is the ustrain checkpoint step" -- \
    $UST data prep --out $ck/step_2 $TMP/tools/t.txt
expect_exit data_demo_inside_a_step_exits_2 2 "data demo: .* is inside the ustrain checkpoint step" -- \
    $UST data demo $ck/step_2/data
# every other file a command writes: generate's logits, plan's config, the run's metrics,
# TensorBoard and out_dir (and a run.out_dir that is a file is refused, not warned about)
expect_exit generate_dump_logits_into_a_step_exits_2 2 "--dump-logits .*step_2/model.safetensors is inside the ustrain checkpoint step" -- \
    $UST generate $ck/step_2 --prompt hi --max-new-tokens 2 --dump-logits $ck/step_2/model.safetensors
expect_exit plan_write_into_a_step_exits_2 2 "--write .*step_2/state.json is inside the ustrain checkpoint step" -- \
    $UST plan $TMP/c.yaml --world 2 --write $ck/step_2/state.json
expect_exit plan_write_over_latest_exits_2 2 "--write .*/latest is a ustrain checkpoint directory's latest" -- \
    $UST plan $TMP/c.yaml --world 2 --write $ck/latest
expect_exit metrics_file_in_a_step_exits_2 2 "logging.metrics_file .*step_4/model.safetensors is inside the ustrain checkpoint step" -- \
    run $TMP/tools/other 2 --set logging.metrics_file=$ck/step_4/model.safetensors
expect_exit metrics_file_over_latest_exits_2 2 "logging.metrics_file .*/latest is a ustrain checkpoint directory's latest" -- \
    run $TMP/tools/other 2 --set logging.metrics_file=$ck/latest
expect_exit tensorboard_dir_in_a_step_exits_2 2 "logging.tensorboard_dir .* is inside the ustrain checkpoint step" -- \
    run $TMP/tools/other 2 --set logging.tensorboard_dir=$ck/step_2/tb
expect_exit out_dir_in_a_step_exits_2 2 "run.out_dir .* is inside the ustrain checkpoint step" -- \
    run $TMP/tools/other 2 --set run.out_dir=$ck/step_2/out
touch $TMP/tools/afile
expect_exit out_dir_that_is_a_file_exits_2 2 "run.out_dir .*afile is a regular file, not a directory" -- \
    run $TMP/tools/other 2 --set run.out_dir=$TMP/tools/afile
intact tools_never_write_into_a_checkpoint $ck "$before"
# two exports into one OUT: the second is refused while the first holds OUT's lock
mkdir -p $TMP/tools/busy
hold_lock $TMP/tools/busy
expect_exit a_second_export_into_a_locked_out_exits_2 2 "output .*busy is being written by another process" -- \
    $UST export $ck/step_2 --to hf $TMP/tools/busy
release_lock
expect_exit export_after_the_lock_is_released 0 "exported .*step_2 to .*busy" -- $UST export $ck/step_2 --to hf $TMP/tools/busy

# --- a resume (or eval) of a checkpoint from another model: checkpoint.resume: auto refuses it
# as another run's, naming what differs; named in checkpoint.resume, the tensors the configured
# model does not have are refused, naming them, as missing or reshaped ones are; nothing is
# trained ----------
ck=$TMP/shape/ck
run $ck 2 >$TMP/o 2>&1 || fail shape_setup "$(tail -3 $TMP/o)"
before=$(sums $ck)
expect_exit resume_auto_of_another_shape_exits_2_naming_it 2 \
    "another run's: model.n_layer 1 \(the checkpoint's 2\), model.tie_embeddings 1 \(the checkpoint's 0\)" -- \
    run $ck 4 --set model.n_layer=1 --set model.tie_embeddings=true
expect_exit resume_with_fewer_layers_exits_2_naming_the_unused_tensors 2 \
    "step_2: model.safetensors holds 9 tensors the configured model does not have \('model.layers.1.input_layernorm.weight'" -- \
    run $ck 4 --set model.n_layer=1 --set checkpoint.resume=$ck/step_2
expect_exit resume_with_tied_embeddings_exits_2 2 "holds 1 tensor the configured model does not have \('lm_head.weight'\)" -- \
    run $ck 4 --set model.tie_embeddings=true --set checkpoint.resume=$ck/step_2
expect_exit resume_with_more_layers_exits_2 2 "tensor 'model.layers.2.* missing from model.safetensors" -- \
    run $ck 4 --set model.n_layer=3 --set checkpoint.resume=$ck/step_2
expect_exit eval_with_fewer_layers_exits_2 2 "holds 9 tensors the configured model does not have" -- \
    $UST eval $ck --data "$TMP/data/val_*.bin" --steps 1 --set model.n_layer=1
expect_exit resume_with_another_seq_len_exits_2 2 "train.seq_len = 16, but the checkpoint was trained with 32: its data position" -- \
    run $ck 4 --set train.seq_len=16
intact other_models_leave_the_checkpoint_as_it_was $ck "$before"
expect_exit the_same_model_still_resumes 0 "resuming from .*step_2" -- run $ck 4

# --- NaN weights (sealed as they are): eval and generate exit 1 naming it, as training does
ck=$TMP/nan/ck
run $ck 2 >$TMP/o 2>&1 || fail nan_setup "$(tail -3 $TMP/o)"
python3 - $ck/step_2/model.safetensors <<'PYEOF'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
b[8 + n:] = b"\x00\x00\xc0\x7f" * ((len(b) - 8 - n) // 4)
open(p, "wb").write(b)
PYEOF
python3 test/tools/reseal.py $ck/step_2
expect_exit eval_of_nan_weights_exits_1 1 "eval: the loss is not finite" -- \
    $UST eval $ck --data "$TMP/data/val_*.bin" --steps 1
expect_exit generate_from_nan_weights_exits_1 1 "generate: the logits of token 0 are not finite" -- \
    $UST generate $ck --prompt hi --max-new-tokens 4 --temperature 0

# --- a tensor file moved between two step directories (manifests resealed): each file says the
# step it was written for, so resume, export and generate refuse it instead of mixing steps
ck=$TMP/moved/ck
run $ck 4 >$TMP/o 2>&1 || fail moved_setup "$(tail -3 $TMP/o)"
mv $ck/step_2/model.safetensors $TMP/m2 && mv $ck/step_4/model.safetensors $ck/step_2/ && mv $TMP/m2 $ck/step_4/model.safetensors
python3 test/tools/reseal.py $ck/step_2 && python3 test/tools/reseal.py $ck/step_4
before=$(sums $ck)
expect_exit resume_of_a_moved_file_exits_2 2 "step_4: model.safetensors was written for step 2, but state.json is step 4" -- \
    run $ck 6 --set checkpoint.resume=$ck/step_4
expect_exit export_of_a_moved_file_exits_2 2 "model.safetensors was written for step 2, but state.json is step 4" -- \
    $UST export $ck/step_4 --to hf $TMP/moved/hf
expect_exit generate_from_a_moved_file_exits_2 2 "model.safetensors was written for step 4, but state.json is step 2" -- \
    $UST generate $ck/step_2 --prompt hi --max-new-tokens 2
intact moved_files_leave_the_checkpoints_as_they_were $ck "$before"

# --- issue 33 item 5: the manifest covers every file of the step and is for its step -----------
# a manifest that leaves model.safetensors (or the optimizer state) out would let a damaged file
# be read unverified: a NaN poked into it; an explicit resume refuses, auto-resume falls back
ck=$TMP/cover/ck
run $ck 8 >$TMP/o 2>&1 || fail cover_setup "$(tail -3 $TMP/o)"
cp -r $ck $TMP/cover/orig
# drop FILE STEP: FILE's entry leaves STEP's manifest, and a NaN goes into the file's data
drop() {
    python3 - $ck/$2 $1 <<'PYEOF'
import json, struct, sys
d, name = sys.argv[1], sys.argv[2]
m = json.load(open(f"{d}/manifest.json"))
m["files"] = [f for f in m["files"] if f["name"] != name]
json.dump(m, open(f"{d}/manifest.json", "w"), indent=1)
b = bytearray(open(f"{d}/{name}", "rb").read()); n = struct.unpack("<Q", b[:8])[0]
b[8 + n:8 + n + 4] = b"\x00\x00\xc0\x7f"
open(f"{d}/{name}", "wb").write(b)
PYEOF
}
drop model.safetensors step_8
before=$(sums $ck)
expect_exit manifest_without_model_file_explicit_resume_exits_2 2 "step_8: manifest.json does not cover model.safetensors" -- \
    run $ck 10 --set checkpoint.resume=$ck/step_8
expect_exit manifest_without_model_file_export_exits_2 2 "step_8: manifest.json does not cover model.safetensors" -- \
    $UST export $ck/step_8 --to hf $TMP/cover/hf
expect_exit manifest_without_model_file_generate_exits_2 2 "step_8: manifest.json does not cover model.safetensors" -- \
    $UST generate $ck/step_8 --prompt hi --max-new-tokens 2
intact manifest_without_model_file_leaves_the_checkpoint $ck "$before"
out=$(run $ck 10 2>&1); rc=$?
[ $rc = 0 ] && echo "$out" | grep -q "warning: checkpoint .*step_8: manifest.json does not cover model.safetensors" &&
    echo "$out" | grep -q "resuming from .*step_6" && pass manifest_without_model_file_auto_resume_falls_back ||
    fail manifest_without_model_file_auto_resume_falls_back "exit $rc: $(echo "$out" | grep -E 'warning|resuming|error' | head -3)"
rm -rf $ck && cp -r $TMP/cover/orig $ck
drop optimizer.safetensors step_8
expect_exit manifest_without_optimizer_file_explicit_resume_exits_2 2 "step_8: manifest.json does not cover optimizer.safetensors" -- \
    run $ck 10 --set checkpoint.resume=$ck/step_8
# an explicit resume checks the manifest's step as auto-resume does
rm -rf $ck && cp -r $TMP/cover/orig $ck
python3 -c "
import json, sys; p = sys.argv[1]; m = json.load(open(p)); m['step'] = 6; json.dump(m, open(p, 'w'))" $ck/step_8/manifest.json
expect_exit manifest_of_another_step_explicit_resume_exits_2 2 "step_8: manifest.json is for another step \(it says 6, the step is 8\)" -- \
    run $ck 10 --set checkpoint.resume=$ck/step_8

# --- issue 33 item 10: a published step_N is never unfinished; a damaged one is skipped with a
# warning naming it (as a bad manifest is), and auto-resume falls back to the previous step
for how in nostate file; do
    ck=$TMP/pub-$how/ck
    run $ck 4 >$TMP/o 2>&1 || fail published_${how}_setup "$(tail -3 $TMP/o)"
    if [ $how = nostate ]; then
        rm $ck/step_4/state.json; want="step_4 has no usable state.json \(No such file or directory"
    else
        rm -rf $ck/step_4 && echo junk >$ck/step_4; want="step_4 is a regular file, not a directory"
    fi
    out=$(run $ck 6 2>&1); rc=$?
    [ $rc = 0 ] && echo "$out" | grep -qE "warning: checkpoint .*$want.*not resumed from" &&
        echo "$out" | grep -q "resuming from .*step_2" && pass published_step_${how}_warns_naming_it_and_falls_back ||
        fail published_step_${how}_warns_naming_it_and_falls_back "exit $rc: $(echo "$out" | grep -E 'warning|resuming|error' | head -3)"
done
