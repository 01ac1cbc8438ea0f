#!/usr/bin/env bash
# A CPU job across nodes, on the namespace bed (test/sh/multinode_lib.sh): two namespaces, each a
# node running `scripts/ustrun --nnodes 2 --node-rank i --master-addr <node 0>` with 2 ranks.
# Groups inside a node use shared memory, groups across nodes gloo over the veth pair.
#  - every collective and send/recv case of test_comm (world across nodes: gloo; the topology's
#    groups mixed) and `ustrain bench comm` (every result checked) across the two nodes;
#  - dp across nodes with tp inside, and pp across nodes, train the single-process model
#    (test/tools/equiv.py with the bed as its launcher);
#  - tp over both nodes trains, with a warning that says why it is slow (silenced by the config);
#  - a node that dies (every process of its namespace killed) ends the job on the other node
#    within dist.timeout_s, naming the lost node and its address.
# Skipped with a SKIP line where network namespaces cannot be made (not root, no iproute2). First,
# without namespaces: gloo's rendezvous through the PMIx store (mpirun, UST_COMM_GLOO=all).
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/multinode_lib.sh"

# gloo's rendezvous through the PMIx store too (mpirun on this host; needs no namespaces)
if command -v mpirun >/dev/null && grep -q "comm/gloo" "$UST"; then
    out=$(UST_COMM_GLOO=all timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x UST_COMM_GLOO \
        $UST bench comm --min-bytes 4K --max-bytes 16K --iters 2 --timeout 60 2>&1)
    echo "$out" | grep -q "2 ranks, backend gloo, bootstrap pmix" && echo "$out" | grep -q "all results correct" &&
        pass gloo_over_the_pmix_store_under_mpirun || fail gloo_over_the_pmix_store_under_mpirun "$(echo "$out" | tail -3)"
fi

# the CPU memory check counts only the ranks the launcher puts on this machine: a layout whose
# 4096 ranks could never share one machine's RAM (2.4 GiB each) validates at 2 ranks per node
$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" configs/tiny.yaml >$TMP/big.yaml
V="$UST validate $TMP/big.yaml --set model.d_model=1024 --set model.n_head=8 --set model.n_kv_head=8 --set model.d_ff=4096
   --set model.n_layer=8 --set parallel.dp=4096 --set train.global_batch_size=16384 --world 4096"
out1=$($V 2>&1); rc1=$?
out2=$(LOCAL_WORLD_SIZE=2 $V 2>&1); rc2=$?
[ $rc1 = 2 ] && echo "$out1" | grep -q "for the 4096 ranks of this layout" && [ $rc2 = 0 ] &&
    pass cpu_memory_check_counts_the_ranks_of_this_node ||
    fail cpu_memory_check_counts_the_ranks_of_this_node "rc $rc1/$rc2: $(echo "$out1" | tail -1) / $(echo "$out2" | tail -1)"

why=$(mn_skip_reason)
if [ -n "$why" ]; then
    echo "SKIP multinode: $why"
    exit 0
fi
mn_up 2 || { fail multinode_bed "could not make 2 network namespaces"; exit 1; }
BUILD=${BUILD:-build}

# every case of the comm tests, 4 ranks on 2 nodes
mn_run 2 $BUILD/test/test_comm >$TMP/comm.out 2>&1
rc=$?
nok=$(grep -c '\] ok ' $TMP/comm.out)
if [ $rc = 0 ] && [ "$nok" -ge 400 ] && ! grep -q '\] bad ' $TMP/comm.out; then
    pass multinode_comm_every_collective_across_2_nodes
else
    fail multinode_comm_every_collective_across_2_nodes "rc=$rc, $nok ok: $(grep -m3 'bad \|error' $TMP/comm.out)"
fi

# (the gloo device bound by interface name here, by the route to MASTER_ADDR elsewhere)
UST_GLOO_IFACE=eth0 mn_run 2 $UST bench comm --min-bytes 4K --max-bytes 256K --iters 2 --timeout 60 >$TMP/bench.out 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "4 ranks, backend gloo" $TMP/bench.out &&
    grep -q "bench comm: all results correct" $TMP/bench.out; then
    pass multinode_bench_comm_across_2_nodes_all_results_correct
else
    fail multinode_bench_comm_across_2_nodes_all_results_correct "rc=$rc: $(grep -v '_' $TMP/bench.out | tail -3)"
fi

# the equivalence harness over the bed
equiv_configs multinode 4 2
python3 test/tools/equiv.py --steps 3 --name _multinode --config $TMP/llama.yaml --ustrun $TMP/mnrun \
    --layout "dp=2 tp=2 zero=1" --layout "pp=2 tp=2" --layout "pp=2 dp=2"

# tp across nodes works but is warned about, with the reason; the config can silence it
W1="--set train.steps=1 --set checkpoint.resume=none --set checkpoint.dir=$TMP/w/ckpt --set parallel.tp=4"
mn_run 2 $UST train $TMP/gpt2.yaml $W1 >$TMP/warn.out 2>&1
rc=$?
mn_run 2 $UST train $TMP/gpt2.yaml $W1 --set parallel.tp_across_nodes=true >$TMP/quiet.out 2>&1
rc2=$?
if [ $rc = 0 ] && [ $rc2 = 0 ] &&
    grep -q "warning: the tp group of global ranks 0, 1, 2, 3 spans nodes 0 and 1: tensor parallelism" $TMP/warn.out &&
    [ "$(grep -c 'spans nodes' $TMP/warn.out)" = 1 ] && ! grep -q "spans nodes" $TMP/quiet.out; then
    pass multinode_tp_across_nodes_is_warned_with_the_reason
else
    fail multinode_tp_across_nodes_is_warned_with_the_reason "rc=$rc/$rc2: $(grep -m2 'warning\|error' $TMP/warn.out)"
fi

# a node dies: node 0's ranks end within dist.timeout_s and name node 1
cat >$TMP/die.yaml <<EOT
$(cat $TMP/llama.yaml)
checkpoint: {dir: $TMP/die/ckpt, every: 0}
logging: {metrics_file: $TMP/die/metrics.jsonl}
dist: {timeout_s: 20}
EOT
sed -i 's/^train: {/train: {steps: 100000, /' $TMP/die.yaml
mn_start 2 $UST train $TMP/die.yaml --set parallel.dp=4
for _ in $(seq 600); do [ "$(cat $TMP/die/metrics.jsonl 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
t0=$SECONDS
disown ${MN_PIDS[1]} # its launcher dies with the node: no job-control notice about it
mn_kill_node 1
wait ${MN_PIDS[0]}
rc=$?
dt=$((SECONDS - t0))
[ -n "${VERBOSE:-}" ] && grep error $TMP/node0.out
if [ $rc != 0 ] && [ $dt -lt 20 ] && grep -q "node 1 (10.231.0.2)" $TMP/node0.out; then
    pass multinode_dead_node_named_within_the_timeout
else
    fail multinode_dead_node_named_within_the_timeout "rc=$rc after ${dt}s: $(grep -m2 'error' $TMP/node0.out)"
fi
exit 0
