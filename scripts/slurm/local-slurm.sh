#!/usr/bin/env bash
# A single-node Slurm on this machine, for tests: munged, slurmctld and slurmd on 127.0.0.1.
#
#   scripts/slurm/local-slurm.sh start [DIR]   # prints `export SLURM_CONF=DIR/slurm.conf`
#   SLURM_CONF=DIR/slurm.conf srun --mpi=pmix -n 4 ./ustrain bench comm
#   scripts/slurm/local-slurm.sh stop [DIR]
#
# Everything (config, munge key and socket, spool, state, logs, pid files) lives in DIR (default
# /tmp/ustrain-slurm); nothing under /etc is touched, and the daemons are stopped by the PIDs
# recorded there. The node is declared with 64 CPUs whatever the machine has, and
# SlurmdParameters=config_overrides lets slurmd accept that: with the real CPU count, `srun -n 4`
# on a 2-core machine would wait forever for resources. MpiDefault=pmix. Needs root (slurmd) and
# the Debian packages slurm-wlm and munge. Ports: SLURM_LOCAL_PORT (default 16817) and the next.
set -u
cmd=${1:-}
D=${2:-/tmp/ustrain-slurm}
NODE=$(hostname -s)
PORT=${SLURM_LOCAL_PORT:-16817}

die() { echo "local-slurm: $*" >&2; exit 1; }

stop_pid() { # name: TERM, then KILL after 5 s
    local f="$D/$1.pid" pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f" 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$f"
}

wait_for() { # seconds description command...: polls every 0.2 s
    local secs=$1 what=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -ge $end ] && return 1
        sleep 0.2
    done
}

stop_all() { stop_pid slurmd; stop_pid slurmctld; stop_pid munged; }

case "$cmd" in
start)
    [ -f "$D/slurmctld.pid" ] && { echo "local-slurm: $D already holds a running Slurm; stop it first" >&2; exit 1; }
    # A start that fails half-way stops what it started.
    die() { echo "local-slurm: $*" >&2; stop_all; exit 1; }
    [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as any user)"
    for b in munged slurmctld slurmd srun sinfo; do
        command -v "$b" >/dev/null || die "$b not found: install the Debian packages slurm-wlm and munge"
    done
    mkdir -p "$D"/{spool,state,log,munge,tmp}
    chmod 700 "$D/munge"
    [ -f "$D/munge/munge.key" ] || { dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 2>/dev/null; chmod 400 "$D/munge/munge.key"; }
    munged --force --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
        --pid-file="$D/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/seed" \
        || die "munged did not start: $(tail -3 "$D/log/munged.log" 2>/dev/null)"
    cat >"$D/slurm.conf" <<EOF
ClusterName=ustrain-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
TmpFS=$D/tmp
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=5
InactiveLimit=0
MinJobAge=10
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=64 RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    export SLURM_CONF="$D/slurm.conf"
    slurmctld -f "$SLURM_CONF" -i || die "slurmctld did not start: $(tail -3 "$D/log/slurmctld.log")"
    wait_for 15 slurmctld test -s "$D/slurmctld.pid" || die "slurmctld wrote no pid file: $(tail -3 "$D/log/slurmctld.log")"
    slurmd -f "$SLURM_CONF" -N "$NODE" || die "slurmd did not start: $(tail -3 "$D/log/slurmd.log")"
    wait_for 15 slurmd test -s "$D/slurmd.pid" || die "slurmd wrote no pid file: $(tail -3 "$D/log/slurmd.log")"
    # Ready when the node is idle (it may first show as unknown or down).
    if ! wait_for 30 node sh -c "sinfo -h -N -o %t | grep -q '^idle'"; then
        scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1
        wait_for 10 node sh -c "sinfo -h -N -o %t | grep -q '^idle'" ||
            die "node $NODE is not idle: $(sinfo -h -N -o '%t %E' 2>&1); $(tail -3 "$D/log/slurmd.log")"
    fi
    echo "export SLURM_CONF=$D/slurm.conf"
    ;;
stop)
    stop_all
    ;;
*)
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
    ;;
esac
