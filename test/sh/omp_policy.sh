#!/usr/bin/env bash
# The OpenMP spin count on a shared machine (docs/performance.md): a computing command started
# without OMP_WAIT_POLICY or GOMP_SPINCOUNT runs with the short spin ops_cpu_spin_count picks
# (0 when the node's ranks outnumber its cores), read back from libgomp itself (OMP_DISPLAY_ENV
# prints the spin count libgomp loaded with; the last print is the re-executed process's); an
# explicit user setting, or UST_OMP_AUTO=0, is kept as is; a run through the re-exec trains the
# same losses as one with the policy set by hand.
. "$(dirname "$0")/../lib.sh"

# spin_counts [VAR=VALUE...]: the GOMP_SPINCOUNT values libgomp reports, one per process start,
# for `train` of a missing config (exits before any work) with only the given OpenMP settings
spin_counts() {
    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS -u UST_OMP_AUTO \
        -u LOCAL_WORLD_SIZE "$@" OMP_DISPLAY_ENV=verbose $UST train $TMP/missing.yaml 2>&1 |
        sed -n "s/^ *GOMP_SPINCOUNT = '\([0-9]*\)'.*/\1/p" | tr '\n' ' ' | sed 's/ $//'
}

# unset: two starts, the second with a short spin (libgomp's default is 300000, ~3 ms)
got=$(spin_counts)
last=${got##* }
if [ "$got" != "${got#* }" ] && [ -n "$last" ] && [ "$last" -gt 0 ] && [ "$last" -lt 300000 ]; then
    pass omp_spin_short_when_unset
else
    fail omp_spin_short_when_unset "libgomp spin counts per start: '$got' (want a re-exec with 0 < n < 300000)"
fi
# more ranks on the node than cores (as scripts/ustrun sets it): sleep at once
got=$(spin_counts LOCAL_WORLD_SIZE=$(($(getconf _NPROCESSORS_ONLN) * 2)) OMP_NUM_THREADS=1)
[ "${got##* }" = 0 ] && [ "$got" != 0 ] && pass omp_spin_zero_when_ranks_oversubscribe ||
    fail omp_spin_zero_when_ranks_oversubscribe "libgomp spin counts per start: '$got' (want a re-exec with 0)"
# under scripts/ustrun every rank re-executes with the spin count of its node's ranks
got=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS OMP_DISPLAY_ENV=verbose \
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/missing.yaml 2>&1 |
    sed -n "s/^\[rank \([01]\)\] *GOMP_SPINCOUNT = '\([0-9]*\)'.*/\1:\2/p" | sort | tr '\n' ' ')
threads=$(($(getconf _NPROCESSORS_ONLN) / 2))
spin=$(spin_counts LOCAL_WORLD_SIZE=2 OMP_NUM_THREADS=$((threads > 0 ? threads : 1)))
want=$(printf '%s\n' 0:300000 1:300000 0:${spin##* } 1:${spin##* } | sort | tr '\n' ' ')
[ "$got" = "$want" ] && pass omp_spin_chosen_under_ustrun ||
    fail omp_spin_chosen_under_ustrun "rank:spin count per start '$got', want '$want'"
# an explicit setting is the user's: one start, their value
got=$(spin_counts OMP_WAIT_POLICY=ACTIVE)
[ "$got" = 30000000000 ] && pass omp_user_wait_policy_kept ||
    fail omp_user_wait_policy_kept "libgomp spin counts per start: '$got' (want 30000000000 once)"
got=$(spin_counts GOMP_SPINCOUNT=77)
[ "$got" = 77 ] && pass omp_user_spincount_kept ||
    fail omp_user_spincount_kept "libgomp spin counts per start: '$got' (want 77 once)"
got=$(spin_counts UST_OMP_AUTO=0)
[ "$got" = 300000 ] && pass omp_auto_opt_out_kept ||
    fail omp_auto_opt_out_kept "libgomp spin counts per start: '$got' (want libgomp's 300000 once)"
# commands that do not compute start once
got=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose $UST validate $TMP/missing.yaml 2>&1 |
    grep -c GOMP_SPINCOUNT)
[ "$got" = 1 ] && pass omp_validate_not_reexecuted ||
    fail omp_validate_not_reexecuted "$got libgomp starts (want 1)"

# a 2-thread run through the re-exec: same arguments, same environment, same losses
equiv_configs omp 4 2
train_losses() {
    local m=$TMP/m$1.jsonl
    shift
    env "$@" OMP_NUM_THREADS=2 $UST train $TMP/llama.yaml --set train.steps=3 \
        --set checkpoint.resume=none --set "logging.metrics_file=$m" >$TMP/out 2>&1 ||
        { echo "exit $?: $(tail -2 $TMP/out)"; return; }
    grep -o '"loss":[0-9.e+-]*' $m | tr '\n' ' '
}
auto=$(train_losses 1 -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u UST_OMP_AUTO)
manual=$(train_losses 2 OMP_WAIT_POLICY=PASSIVE)
[ -n "$auto" ] && [ "$auto" = "$manual" ] && [ "${auto#exit}" = "$auto" ] &&
    pass omp_reexec_run_trains_the_same || fail omp_reexec_run_trains_the_same "auto '$auto' vs passive '$manual'"
