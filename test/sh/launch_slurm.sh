# Slurm as the launcher: a real single-node Slurm (munged, slurmctld, slurmd on 127.0.0.1, started
# and stopped here by scripts/slurm/local-slurm.sh), ranks started by `srun --mpi=pmix` bootstrap
# over Slurm's PMIx server. Also: srun without PMIx gives the error that names --mpi=pmix.
. test/lib.sh
. test/sh/launch_lib.sh

if [ "$(id -u)" != 0 ]; then
    echo "SKIP launch_slurm: slurmd needs root to start jobs"
    exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v srun >/dev/null; then
    if ! UST_EXTRA_PKGS="slurm-wlm munge" timeout 600 scripts/install-deps.sh >"$TMP/install.log" 2>&1; then
        echo "SKIP launch_slurm: slurm-wlm and munge are not installed and could not be installed: $(tail -1 "$TMP/install.log")"
        exit 0
    fi
fi
if [ ! -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] && ! ls /usr/lib*/slurm*/mpi_pmix*.so >/dev/null 2>&1; then
    echo "SKIP launch_slurm: this Slurm has no PMIx plugin (mpi_pmix.so)"
    exit 0
fi

# Run outside any enclosing Slurm job or PMIx launcher (their variables would steer srun and the
# ranks to the outer job).
for v in $(env | grep -oE '^(SLURM|PMIX|PMI|OMPI)_[A-Za-z0-9_]*'); do unset "$v"; done

# Two consecutive free ports for slurmctld and slurmd, so parallel test runs do not collide.
port=$(python3 -c '
import random, socket
for _ in range(200):
    p = random.randrange(20000, 40000)
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass')
D="$TMP/slurm"
trap 'scripts/slurm/local-slurm.sh stop "$D" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
# Some machines cannot run slurmd (containers without the privileges it needs): that is a SKIP
# with the reason, not a failure of ustrain.
if ! SLURM_LOCAL_PORT=$port timeout 90 scripts/slurm/local-slurm.sh start "$D" >"$TMP/start.log" 2>&1; then
    echo "SKIP launch_slurm: the local Slurm did not start: $(tail -2 "$TMP/start.log" | tr '\n' ' ')"
    exit 0
fi
pass local_slurm_starts
export SLURM_CONF="$D/slurm.conf"

ranks_check_ok srun_pmix_2_ranks_bootstrap_check 2 -- timeout 90 srun --mpi=pmix -n 2 "$TB" --ranks-check --timeout 30
ranks_check_ok srun_pmix_8_ranks_bootstrap_check 8 -- timeout 120 srun --mpi=pmix -n 8 "$TB" --ranks-check --timeout 30
out=$(timeout 60 srun --mpi=pmix -n 2 "$TB" --ranks-check --timeout 20 2>&1)
if [ "$(echo "$out" | grep -c 'kind pmix, local [01] of 2, node 0 of 1, job pmix-slurm')" = 2 ]; then pass srun_ranks_get_local_ranks_and_job_id_from_pmix
else fail srun_ranks_get_local_ranks_and_job_id_from_pmix "$(echo "$out" | head -3)"; fi
expect_exit srun_without_pmix_names_mpi_pmix 2 "SLURM_NTASKS=2.*srun --mpi=pmix" -- timeout 60 srun --mpi=none --kill-on-bad-exit=0 -n 2 "$TB" --ranks-check --timeout 5
# The sbatch example at least parses as a shell script.
if bash -n scripts/slurm/ustrain.sbatch 2>"$TMP/e"; then pass sbatch_example_parses
else fail sbatch_example_parses "$(cat "$TMP/e")"; fi

# A rank SIGKILLed after joining: the launcher ends the job, non-zero, within seconds.
t0=$(date +%s)
timeout 30 srun --mpi=pmix -n 2 "$TB" --ranks-check --timeout 10 --die-rank 1 >"$TMP/o" 2>&1
rc=$?; dt=$(( $(date +%s) - t0 ))
if [ $rc != 0 ] && [ $rc != 124 ] && [ $dt -le 8 ]; then pass srun_sigkilled_rank_ends_the_job
else fail srun_sigkilled_rank_ends_the_job "exit $rc after ${dt}s: $(tail -2 "$TMP/o")"; fi

# Graceful stop under Slurm: `scancel --signal=USR1` (what a job's time limit warning sends) reaches
# every rank of a training job; they agree on one step, write a checkpoint and exit 0.
$UST data demo $TMP/sdata >/dev/null
sed -e "s#data/tiny/#$TMP/sdata/#g" -e "s#runs/tiny#$TMP/srun#g" configs/tiny.yaml >$TMP/s.yaml
timeout 120 srun --mpi=pmix -n 2 -J ust-stop "$UST" train $TMP/s.yaml --set parallel.dp=2 \
    --set train.steps=100000 --set checkpoint.every=100000 >$TMP/so 2>&1 &
srun_pid=$!
for _ in $(seq 600); do [ "$(cat $TMP/srun/metrics.jsonl 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
scancel --signal=USR1 "$(squeue -h -n ust-stop -o %i | head -1)"
wait $srun_pid; rc=$?
step=$(sed 's/step_//' $TMP/srun/ckpt/latest 2>/dev/null)
if [ $rc = 0 ] && [ -n "$step" ] && [ -f $TMP/srun/ckpt/step_$step/model.safetensors ] &&
    grep -q "received signal: stopped after step $step" $TMP/so; then
    pass scancel_usr1_stops_a_training_job_with_a_checkpoint
else
    fail scancel_usr1_stops_a_training_job_with_a_checkpoint "exit $rc, step '$step': $(tail -3 $TMP/so)"
fi

bench_comm_check srun 2 -- timeout 120 srun --mpi=pmix -n 2 "$UST" bench comm $BENCH_ARGS
bench_comm_check srun 8 -- timeout 180 srun --mpi=pmix -n 8 "$UST" bench comm $BENCH_ARGS

# The sbatch example's restart loop (run as a plain script: srun makes its own allocation here).
# Rank 1 dies at step 5 of the first start; the loop runs srun again, which resumes from step 4
# and ends with the uninterrupted run's model, byte for byte.
SM="--set model.n_layer=2 --set model.d_model=64 --set model.d_ff=128 --set train.seq_len=32 --set train.global_batch_size=4 --set train.micro_batch_size=2 --set train.steps=8 --set checkpoint.every=2 --set data.val_every=0"
timeout 120 srun --mpi=pmix -n 2 "$UST" train $TMP/s.yaml $SM --set parallel.dp=2 --set checkpoint.dir=$TMP/loopref \
    --set logging.metrics_file=$TMP/loopref.jsonl >$TMP/lr.out 2>&1 || fail sbatch_loop_reference "$(tail -2 $TMP/lr.out)"
out=$(UST=$UST UST_SRUN_ARGS="-n 2" UST_RESTART_BACKOFF=1 UST_FAULT_DIE_STEP=5 UST_FAULT_DIE_RANK=1 \
    timeout 240 bash scripts/slurm/ustrain.sbatch $TMP/s.yaml $SM --set checkpoint.dir=$TMP/loop \
    --set logging.metrics_file=$TMP/loop.jsonl 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "restart 1 of 3" && echo "$out" | grep -q "resuming from .*loop/step_4" &&
   cmp -s $TMP/loopref/step_8/model.safetensors $TMP/loop/step_8/model.safetensors; then
    pass sbatch_restart_loop_resumes_a_killed_job_to_the_same_model
else fail sbatch_restart_loop_resumes_a_killed_job_to_the_same_model "exit $rc: $(echo "$out" | grep -E 'restart|resum|error' | head -4)"; fi
