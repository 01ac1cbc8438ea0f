# The multi-node test bed (sourced by test/sh/multinode*.sh after test/lib.sh): N network
# namespaces on this machine, each a "node" with its own veth address on a private subnet
# (10.231.0.0/24) behind a bridge in one more namespace, so traffic flows only between them and
# the host's own network is never touched. Everything is removed on exit, also on failure. Run on
# its own, as test/run.sh does with every test/sh/*.sh, it does nothing.
[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

MN_PREFIX=ustmn$$
MN_N=0
MN_ADDR=()
MN_JOB=0

# mn_down: removes every namespace of this bed (killing what still runs in them).
mn_down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$MN_PREFIX-"); do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
}

# mn_skip_reason: why the bed cannot be made here (empty when it can).
mn_skip_reason() {
    [ "$(id -u)" = 0 ] || { echo "not root (network namespaces need CAP_SYS_ADMIN)"; return; }
    command -v ip >/dev/null || { echo "no ip command (iproute2)"; return; }
    grep -q "comm/gloo" "$UST" 2>/dev/null || { echo "$UST is built without gloo"; return; }
    ip netns add "$MN_PREFIX-probe" 2>/dev/null || { echo "ip netns add is refused here"; return; }
    local ok=1
    ip netns exec "$MN_PREFIX-probe" true 2>/dev/null || ok=0
    ip -n "$MN_PREFIX-probe" link add v0 type veth peer name v1 2>/dev/null || ok=0
    ip netns del "$MN_PREFIX-probe"
    [ $ok = 1 ] || echo "ip netns exec or veth pairs are refused here"
}

# mn_up N: nodes 0..N-1 as namespaces $MN_PREFIX-<i>, node i at 10.231.0.<i+1>. Namespaces an
# earlier bed left behind (its shell was killed: the pid in the name is gone) are removed first.
mn_up() {
    local n=$1 hub=$MN_PREFIX-hub i ns
    trap 'mn_down; rm -rf "$TMP"' EXIT
    trap 'exit 1' INT TERM
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ustmn[0-9]+-'); do
        i=${ns#ustmn}
        kill -0 ${i%%-*} 2>/dev/null || ip netns del $ns 2>/dev/null
    done
    ip netns add $hub && ip -n $hub link add br0 type bridge && ip -n $hub link set br0 up || return 1
    for i in $(seq 0 $((n - 1))); do
        ns=$MN_PREFIX-$i
        ip netns add $ns &&
            ip -n $hub link add h$i type veth peer name eth0 netns $ns &&
            ip -n $hub link set h$i master br0 up &&
            ip -n $ns addr add 10.231.0.$((i + 1))/24 dev eth0 &&
            ip -n $ns link set eth0 up && ip -n $ns link set lo up || return 1
        MN_ADDR[$i]=10.231.0.$((i + 1))
    done
    MN_N=$n
    mn_launcher $n $TMP/mnrun
}

# mn_launcher K FILE: writes FILE, a launcher the equivalence harness calls as
# `ustrun --nproc-per-node W cmd...`: W/K ranks on each of nodes 0..K-1.
mn_launcher() {
    cat >$2 <<EOT
#!/usr/bin/env bash
# ustrun over $1 of the namespaces: W ranks, W/$1 per node.
w=\$2; shift 2
. "$PWD/test/sh/multinode_lib.sh"
MN_PREFIX=$MN_PREFIX MN_N=$1 MN_ADDR=(${MN_ADDR[*]}) TMP=$TMP
mn_run \$((w / $1)) "\$@"
EOT
    chmod +x $2
}

# mn_start NPROC cmd...: starts scripts/ustrun on every node (NPROC ranks each, node 0 serving the
# store at its address) in the background; MN_PIDS gets the launchers' pids, $TMP/node<i>.out
# their output. Every node shares one job secret and id, as real nodes must.
mn_start() {
    local np=$1 i
    shift
    MN_JOB=$((MN_JOB + 1))
    local secret=mn$$x$MN_JOB$RANDOM$RANDOM id=mn$$_$MN_JOB
    MN_PIDS=()
    for i in $(seq 0 $((MN_N - 1))); do
        ip netns exec $MN_PREFIX-$i env UST_JOB_SECRET=$secret UST_JOB_ID=$id \
            scripts/ustrun --nnodes $MN_N --node-rank $i --master-addr ${MN_ADDR[0]} \
            --master-port 29500 --nproc-per-node $np "$@" >$TMP/node$i.out 2>&1 &
        MN_PIDS[$i]=$!
    done
}

# mn_wait: waits for every launcher of mn_start; prints their output (node order) and returns
# the first failed node's exit code (0 when all succeeded).
mn_wait() {
    local i rc=0 r
    for i in $(seq 0 $((MN_N - 1))); do
        wait ${MN_PIDS[$i]}
        r=$?
        [ $rc = 0 ] && rc=$r
    done
    for i in $(seq 0 $((MN_N - 1))); do sed "s/^/[node $i] /" $TMP/node$i.out; done
    return $rc
}

# mn_run NPROC cmd...: mn_start, then mn_wait.
mn_run() {
    mn_start "$@"
    mn_wait
}

# mn_kill_node I: kills every process of node I (its namespace), as if the machine died.
mn_kill_node() {
    local p
    for p in $(ip netns pids $MN_PREFIX-$1); do kill -9 "$p" 2>/dev/null; done
}
