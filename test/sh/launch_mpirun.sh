# OpenMPI's mpirun as the launcher: it is a PMIx server for a program that does not use MPI, so
# the ranks bootstrap over PMIx (node-local ranks and the job id come from it).
. test/lib.sh
. test/sh/launch_lib.sh

if ! command -v mpirun >/dev/null; then
    echo "SKIP launch_mpirun: mpirun not found (Debian package openmpi-bin)"
    exit 0
fi
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
ranks_check_ok mpirun_2_ranks_bootstrap_check_over_pmix 2 -- timeout 60 $MPIRUN -np 2 "$TB" --ranks-check --timeout 20
ranks_check_ok mpirun_8_ranks_bootstrap_check_over_pmix 8 -- timeout 90 $MPIRUN -np 8 "$TB" --ranks-check --timeout 30
out=$(timeout 60 $MPIRUN -np 2 "$TB" --ranks-check --timeout 20 2>&1)
if [ "$(echo "$out" | grep -c 'kind pmix')" -ge 2 ]; then pass mpirun_ranks_use_the_pmix_bootstrap
else fail mpirun_ranks_use_the_pmix_bootstrap "$(echo "$out" | tail -2)"; fi

# A rank SIGKILLed after joining: the launcher ends the job, non-zero, within seconds.
t0=$(date +%s)
timeout 30 $MPIRUN -np 2 "$TB" --ranks-check --timeout 10 --die-rank 1 >"$TMP/o" 2>&1
rc=$?; dt=$(( $(date +%s) - t0 ))
if [ $rc != 0 ] && [ $rc != 124 ] && [ $dt -le 8 ]; then pass mpirun_sigkilled_rank_ends_the_job
else fail mpirun_sigkilled_rank_ends_the_job "exit $rc after ${dt}s: $(tail -2 "$TMP/o")"; fi

bench_comm_check mpirun 2 -- timeout 120 $MPIRUN -np 2 "$UST" bench comm $BENCH_ARGS
bench_comm_check mpirun 8 -- timeout 180 $MPIRUN -np 8 "$UST" bench comm $BENCH_ARGS
