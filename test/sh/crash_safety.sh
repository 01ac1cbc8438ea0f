#!/usr/bin/env bash
# Crash safety of checkpoints (issue 10, item 4): a rank SIGKILLed while a checkpoint is being
# written leaves the previous checkpoint intact and `latest` pointing to it, the other rank exits
# on its own within dist.timeout_s, and the restarted job resumes from the intact checkpoint.
# A full disk and a checkpoint directory the user may not write give a clear message and keep the
# old checkpoint. (The graceful stop on SIGTERM/SIGUSR1 is tested in train_cli.sh and dp_signal.sh.)
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
# A small model (checkpoints of ~2 MB), a short step; each case gets its own checkpoint dir.
SMALL="--set model.n_layer=2 --set model.d_model=64 --set model.d_ff=128 --set train.seq_len=32 --set train.global_batch_size=4 --set train.micro_batch_size=2"
run() { # run CKDIR STEPS [more args]: train to STEPS with a checkpoint every 2 steps
    local ck=$1 steps=$2; shift 2
    $UST train $TMP/c.yaml $SMALL --set train.steps=$steps --set checkpoint.every=2 \
        --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.metrics.jsonl" "$@"
}
sums() { (cd "$1" && cat latest && find step_* -type f | sort | xargs sha256sum); }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# intact NAME CKDIR BEFORE: latest still names step_2 and its files are byte for byte the same
intact() {
    local after
    after=$(sums "$2" 2>&1)
    if [ "$after" = "$3" ] && [ "$(cat "$2/latest")" = step_2 ] && [ ! -e "$2/step_4" ]; then pass "$1"
    else fail "$1" "latest=$(cat "$2/latest" 2>&1), $(ls -a "$2" | tr '\n' ' ')"; fi
}

# --- SIGKILL to one rank in the middle of writing step 4 (dp=2, ranks started by hand so that
# nothing but the survivor itself ends it). UST_FAULT_CKPT_SLEEP_MS, given to the victim only,
# holds it after its first slice: the files of .tmp_step_4 are half written when it dies.
TIMEOUT_S=10
for victim in 1 0; do
    ck=$TMP/kill$victim/ck
    survivor=$((1 - victim))
    if ! scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 --set train.steps=2 \
        --set checkpoint.every=2 --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.m0.jsonl" >$TMP/o 2>&1; then
        fail sigkill_rank${victim}_mid_checkpoint "first run failed: $(tail -3 $TMP/o)"; continue
    fi
    before=$(sums $ck)
    port=$(free_port)
    pids=()
    for r in 0 1; do
        fault=0; [ $r = $victim ] && fault=20000
        # in a subshell that waits for it, so the SIGKILL is not announced by this shell
        (env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            UST_JOB_SECRET=crash UST_FAULT_CKPT_SLEEP_MS=$fault \
            $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 --set train.steps=4 --set checkpoint.every=2 \
            --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.m$r.jsonl" --set dist.timeout_s=$TIMEOUT_S \
            >$TMP/r$r 2>&1 &
         echo $! >$TMP/pid$r
         wait $!) 2>/dev/null &
        pids[$r]=$!
    done
    for _ in $(seq 600); do ls $ck/.tmp_step_4*/model.safetensors >/dev/null 2>&1 && break; sleep 0.1; done
    sleep 1 # the victim is now in its 20 s hold, with its first slice written
    kill -9 "$(cat $TMP/pid$victim)"
    t_kill=$(date +%s)
    wait ${pids[$survivor]}; rc=$?
    took=$(( $(date +%s) - t_kill ))
    wait ${pids[$victim]} 2>/dev/null
    intact sigkill_rank${victim}_mid_checkpoint_keeps_step_2_and_latest $ck "$before"
    if [ $rc != 0 ] && [ $took -le $TIMEOUT_S ]; then
        pass sigkill_rank${victim}_survivor_exits_within_dist_timeout
    else
        fail sigkill_rank${victim}_survivor_exits_within_dist_timeout "rank $survivor exit $rc after $took s (timeout_s $TIMEOUT_S): $(tail -2 $TMP/r$survivor)"
    fi
    out=$(scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $SMALL --set parallel.dp=2 --set train.steps=4 \
        --set checkpoint.every=2 --set "checkpoint.dir=$ck" --set "logging.metrics_file=$ck.m2.jsonl" 2>&1); rc=$?
    first=$(echo "$out" | grep -o 'step *[0-9]*/4' | head -1 | tr -s ' ')
    if [ $rc = 0 ] && echo "$out" | grep -q "resuming from .*step_2" && [ "$first" = "step 3/4" ] &&
       [ "$(cat $ck/latest)" = step_4 ]; then
        pass sigkill_rank${victim}_restart_resumes_at_step_3
    else
        fail sigkill_rank${victim}_restart_resumes_at_step_3 "exit $rc, first '$first', latest $(cat $ck/latest): $(echo "$out" | tail -2)"
    fi
done

# --- disk full while writing step 4: a small tmpfs when this machine lets us mount one (root
# with CAP_SYS_ADMIN), else the fault switch that makes every write fail with ENOSPC.
full=$TMP/full
mkdir -p $full
trap 'umount "$full" 2>/dev/null; rm -rf "$TMP"' EXIT
if mount -t tmpfs -o size=4m tmpfs $full 2>/dev/null; then how=tmpfs; fault=""; else how=fault; fault="UST_FAULT_CKPT_WRITE_ERRNO=28"; fi
echo "# disk full: $how"
ck=$full/ck
if run $ck 2 >$TMP/o 2>&1; then
    before=$(sums $ck)
    if [ $how = tmpfs ]; then # leave 64 KiB: step 4 cannot fit
        avail=$(df --output=avail -B1 $full | tail -1)
        head -c $((avail - 65536)) /dev/zero >$full/filler 2>/dev/null
    fi
    expect_exit disk_full_gives_a_clear_message 1 "checkpoint at step 4 failed: checkpoint: cannot write .*No space left on device" -- \
        env $fault $UST train $TMP/c.yaml $SMALL --set train.steps=4 --set checkpoint.every=2 --set "checkpoint.dir=$ck" \
        --set "logging.metrics_file=$TMP/full.m.jsonl"
    intact disk_full_keeps_the_old_checkpoint $ck "$before"
    ! ls -d $ck/.tmp_step_* >/dev/null 2>&1 && pass disk_full_removes_the_partial_step || fail disk_full_removes_the_partial_step "$(ls -a $ck)"
else
    fail disk_full_gives_a_clear_message "first run failed: $(tail -3 $TMP/o)"
fi
umount $full 2>/dev/null

# --- a checkpoint directory the user may not write: root ignores permission bits, so the run
# that must fail is started as nobody (setpriv); the directory and step 2 belong to root.
NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"
chmod 755 $TMP
mkdir -m 777 $TMP/nob
NUST=$UST
# a clone under a private directory (/root/...): nobody runs a copy of the binary from $TMP
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && ! $NOBODY $UST --help >/dev/null 2>&1; then
    NUST=$TMP/ustrain-nobody
    cp "$UST" $NUST && chmod 755 $NUST
fi
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
    echo "SKIP checkpoint_dir_not_writable: needs root and setpriv to run as another user"
elif ! $NOBODY $NUST --help >/dev/null 2>&1; then
    echo "SKIP checkpoint_dir_not_writable: user nobody cannot run $UST (a directory above it is private)"
else
    ck=$TMP/perm/ck
    run $ck 2 >$TMP/o 2>&1 || fail checkpoint_dir_not_writable "first run failed: $(tail -3 $TMP/o)"
    before=$(sums $ck)
    # refused at start, before training: the job could not even take the directory's lock
    expect_exit checkpoint_dir_not_writable_gives_a_clear_message 2 "checkpoint.dir .*/ck: cannot lock: .*/ck/.lock: cannot open: Permission denied" -- \
        $NOBODY $NUST train $TMP/c.yaml $SMALL --set train.steps=4 --set checkpoint.every=2 --set "checkpoint.dir=$ck" \
        --set "logging.metrics_file=$TMP/nob/m.jsonl" --set "run.out_dir=$TMP/nob"
    intact checkpoint_dir_not_writable_keeps_the_old_checkpoint $ck "$before"
fi
