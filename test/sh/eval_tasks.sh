#!/usr/bin/env bash
# eval.tasks: multiple-choice tasks scored during training (a tiny Qwen2 fine-tuned on ChatML
# conversations, as docs/huggingface.md's example). The scores in the metrics and TensorBoard at
# a step equal `ustrain eval --task` on that step's checkpoint (which takes the tokenizer the
# checkpoint records); eval scores B choices per micro-batch and every micro-batch size gives the
# same log-likelihoods to the last printed digit; dp, tp, pp, cp and (a MoE model) ep give one
# process's scores; bad entries and bad task files exit 2 naming file:line(:col), the value and
# what is allowed.
. "$(dirname "$0")/../lib.sh"

need_py eval_tasks_needs_torch torch transformers tokenizers tensorboard || exit 0
REF="python3 test/tools/chat_reference.py"
D=$TMP/sft
$REF make $D/src >$TMP/make.log 2>&1 && $REF model $D/model 640 >$TMP/model.log 2>&1 && $REF mc-items $D/mc.jsonl &&
    cp $D/src/chatml/tokenizer.json $D/src/chatml/tokenizer_config.json $D/model/ &&
    $UST data prep --tokenizer $D/model/tokenizer.json --chat auto --out $D/data $D/src/convs.jsonl >$TMP/prep.log 2>&1 ||
    { fail eval_tasks_setup "$(cat $TMP/model.log $TMP/prep.log | tail -3)"; exit 0; }
cat >$TMP/c.yaml <<EOF
run:   {name: tasks, seed: 7, out_dir: $TMP/out}
model: {arch: auto, init_from: $D/model}
train: {steps: 4, seq_len: 128, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 1.0e-3, warmup_steps: 1}
data:  {train: "$D/data/train_*.bin", val: "$D/data/val_*.bin", val_every: 4, val_steps: 2,
        packing: first_fit, pack_buffer: 64}
checkpoint: {every: 2, keep_last: 3}
eval:
  tasks: [{name: mc, path: $D/mc.jsonl, every: 2}]
EOF
# run NAME LAUNCH... -- ARGS...: trains c.yaml into $TMP/NAME (checkpoints, metrics, events)
run() {
    local name=$1 pre=()
    shift
    while [ "$1" != -- ]; do pre+=("$1"); shift; done
    shift
    "${pre[@]}" train $TMP/c.yaml --set checkpoint.dir=$TMP/$name/ckpt --set logging.metrics_file=$TMP/$name/m.jsonl \
        --set logging.tensorboard_dir=$TMP/$name/tb "$@" >$TMP/$name.log 2>&1
}
run one $UST -- || fail eval_tasks_train "$(tail -3 $TMP/one.log)"

# the metrics (steps 2 and 4 only) and TensorBoard carry the same scores; eval --task on the
# step's checkpoint (its tokenizer from state.json) prints and writes the same
for s in 2 4; do
    $UST eval $TMP/one/ckpt/step_$s --task $D/mc.jsonl --scores $TMP/s$s.jsonl >$TMP/e$s.log 2>&1 ||
        fail eval_tasks_eval_step_$s "$(tail -2 $TMP/e$s.log)"
done
python3 - $TMP/one $TMP/s2.jsonl $TMP/s4.jsonl $TMP/e2.log $TMP/e4.log <<'EOT' && pass eval_tasks_scores_equal_eval_on_the_checkpoint || fail eval_tasks_scores_equal_eval_on_the_checkpoint "$(tail -3 $TMP/one.log)"
import json, re, sys
from tensorboard.backend.event_processing import event_accumulator as ea
run, files, logs = sys.argv[1], sys.argv[2:4], sys.argv[4:6]
rows = [json.loads(l) for l in open(run + "/m.jsonl")]
tasks = {r["step"]: r["tasks"]["mc"] for r in rows if "tasks" in r}
assert sorted(tasks) == [2, 4], sorted(tasks)
acc = ea.EventAccumulator(run + "/tb", size_guidance={ea.SCALARS: 0}); acc.Reload()
for step, f, log in zip([2, 4], files, logs):
    items = [json.loads(l) for l in open(f)]
    want = {"items": len(items),
            "acc": sum(i["pred"] == i["label"] for i in items) / len(items),
            "acc_norm": sum(i["pred_norm"] == i["label"] for i in items) / len(items),
            "loglik": sum(i["loglik"][i["label"]] for i in items) / len(items)}
    got = tasks[step]
    assert got["items"] == want["items"] and abs(got["acc"] - want["acc"]) < 1e-8 and \
        abs(got["acc_norm"] - want["acc_norm"]) < 1e-8, (step, got, want)
    assert abs(got["loglik"] - want["loglik"]) <= 1e-7 * abs(want["loglik"]), (step, got, want)
    m = re.search(r"acc ([0-9.]+) acc_norm ([0-9.]+) loglik (-[0-9.]+)", open(log).read())
    assert m and abs(float(m[3]) - got["loglik"]) <= 6e-7, (m and m[0], got)
    for k in ("acc", "acc_norm", "loglik"):
        tb = [e.value for e in acc.Scalars("task/mc/" + k) if e.step == step]
        assert len(tb) == 1 and abs(tb[0] - got[k]) <= 1e-6 * max(1, abs(got[k])), (k, step, tb, got)
print("  step 2 loglik %.7f, step 4 %.7f" % (tasks[2]["loglik"], tasks[4]["loglik"]))
EOT
grep -q "^step 2: task mc: 12 items, acc [0-9.]* acc_norm [0-9.]* loglik -[0-9.]*" $TMP/one.log &&
    pass eval_tasks_line_printed || fail eval_tasks_line_printed "$(grep task $TMP/one.log | head -2)"

# batched scoring: 1, 2 (the run's) and 5 choices per micro-batch, the same scores exactly
$UST eval $TMP/one/ckpt/step_2 --task $D/mc.jsonl --scores $TMP/b1.jsonl --micro-batch-size 1 >$TMP/b1.log 2>&1 &&
    $UST eval $TMP/one/ckpt/step_2 --task $D/mc.jsonl --scores $TMP/b5.jsonl --micro-batch-size 5 >$TMP/b5.log 2>&1 &&
    cmp -s $TMP/b1.jsonl $TMP/s2.jsonl && cmp -s $TMP/b5.jsonl $TMP/s2.jsonl &&
    pass eval_task_batched_equals_one_per_micro_batch || fail eval_task_batched_equals_one_per_micro_batch "$(cat $TMP/b1.log $TMP/b5.log | tail -3; diff $TMP/b1.jsonl $TMP/b5.jsonl | head -4)"

# every layout scores as one process during training (its training itself equal to ~1e-7)
for layout in parallel.dp=2 parallel.tp=2 parallel.pp=2 parallel.cp=2; do
    tag=eval_tasks_same_scores_$(echo $layout | tr '=.' '__')
    run $tag scripts/ustrun --nproc-per-node 2 $UST -- --set $layout &&
        python3 - $TMP/one/m.jsonl $TMP/$tag/m.jsonl <<'EOT' && pass $tag || fail $tag "$(tail -2 $TMP/$tag.log)"
import json, sys
a, b = ({r["step"]: r["tasks"]["mc"] for r in map(json.loads, open(p)) if "tasks" in r} for p in sys.argv[1:3])
assert sorted(a) == sorted(b) == [2, 4], (a, b)
for s in a:
    assert a[s]["acc"] == b[s]["acc"] and a[s]["acc_norm"] == b[s]["acc_norm"], (s, a[s], b[s])
    assert abs(a[s]["loglik"] - b[s]["loglik"]) <= 1e-6 * abs(a[s]["loglik"]), (s, a[s], b[s])
EOT
done

# a mixture-of-experts model on byte tokens (the demo data's meta.json names "bytes": the tasks'
# tokenizer): eval --task under ep=2 dp=2 on the step's checkpoint gives the scores training logged
$UST data demo $TMP/demo >/dev/null 2>&1 &&
    $UST train configs/tiny.yaml --set "data.train=$TMP/demo/train_*.bin" --set "data.val=$TMP/demo/val_*.bin" \
        --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir=$TMP/moe/ckpt --set logging.metrics_file=$TMP/moe/m.jsonl \
        --set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.d_ff_expert=64 \
        --set "eval.tasks=[{name: mc, path: $D/mc.jsonl, every: 2}]" >$TMP/moe.log 2>&1 &&
    scripts/ustrun --nproc-per-node 2 $UST eval $TMP/moe/ckpt --task $D/mc.jsonl --scores $TMP/moe.jsonl \
        --set parallel.dp=2 --set parallel.ep=2 >$TMP/moe_eval.log 2>&1 &&
    python3 - $TMP/moe/m.jsonl $TMP/moe.jsonl <<'EOT' && pass eval_tasks_moe_ep2_scores_equal_training || fail eval_tasks_moe_ep2_scores_equal_training "$(cat $TMP/moe.log $TMP/moe_eval.log | tail -3)"
import json, sys
got = [json.loads(l) for l in open(sys.argv[1]) if '"tasks"' in l][-1]["tasks"]["mc"]
items = [json.loads(l) for l in open(sys.argv[2])]
ll = sum(i["loglik"][i["label"]] for i in items) / len(items)
acc = sum(i["pred"] == i["label"] for i in items) / len(items)
assert got["items"] == 12 and abs(got["acc"] - acc) < 1e-8, (got, acc)
assert abs(got["loglik"] - ll) <= 1e-6 * abs(ll), (got, ll)
EOT

# bad input: the YAML entry (file:line:col, the value, what is allowed), the task file
# (file:line), the tokenizer; exit 2 before any training
bad() { # bad NAME PATTERN TASKS_YAML_LINE
    sed "s|^  tasks: .*|  tasks: $3|" $TMP/c.yaml >$TMP/$1.yaml
    expect_exit $1 2 "$2" -- $UST train $TMP/$1.yaml --set checkpoint.dir=$TMP/bad/ckpt
}
bad eval_tasks_every_0_exit_2 "eval_tasks_every_0_exit_2.yaml:9:[0-9]+: eval.tasks\[0\].every: expected a whole number of steps >= 1, got '0'" \
    "[{name: mc, path: $D/mc.jsonl, every: 0}]"
bad eval_tasks_unknown_key_exit_2 "eval.tasks\[0\]: unknown key 'evry' \(allowed: name, path, every\)" \
    "[{name: mc, path: $D/mc.jsonl, evry: 2}]"
bad eval_tasks_no_path_exit_2 "c.yaml|eval.tasks\[0\]: needs a path" "[{name: mc, every: 2}]"
bad eval_tasks_bad_name_exit_2 "eval.tasks\[0\].name: expected 1 to 63 letters, digits, '_', '-' or '.', got 'm c'" \
    "[{name: 'm c', path: $D/mc.jsonl, every: 2}]"
bad eval_tasks_duplicate_name_exit_2 "eval.tasks\[1\]: the name 'mc' is task 0's already" \
    "[{name: mc, path: $D/mc.jsonl, every: 2}, {name: mc, path: $D/mc.jsonl, every: 3}]"
expect_exit eval_tasks_set_a_string_exit_2 2 "eval.tasks: expected a list of tasks \[\{name: N, path: FILE.jsonl, every: STEPS\}\] or null, got 'mc.jsonl'" -- \
    $UST validate $TMP/c.yaml --set eval.tasks=mc.jsonl
printf '%s\n' '{"context": "a", "choices": ["b", "c"], "label": 1}' '{"context": "a", "choices": ["b", "c"], "label": 2}' >$TMP/badlabel.jsonl
expect_exit eval_tasks_label_out_of_range_exit_2 2 "eval.tasks\[0\] \(mc\): $TMP/badlabel.jsonl:2: label out of range is not a choice's index \(0..1\)" -- \
    $UST train $TMP/c.yaml --set checkpoint.dir=$TMP/bad/ckpt --set "eval.tasks=[{name: mc, path: $TMP/badlabel.jsonl, every: 2}]"
expect_exit eval_tasks_missing_file_exit_2 2 "eval.tasks\[0\] \(mc\): .*$TMP/nothere.jsonl" -- \
    $UST train $TMP/c.yaml --set checkpoint.dir=$TMP/bad/ckpt --set "eval.tasks=[{name: mc, path: $TMP/nothere.jsonl, every: 2}]"
expect_exit eval_tasks_missing_tokenizer_exit_2 2 "eval.tokenizer: .*$TMP/no-tok.json" -- \
    $UST train $TMP/c.yaml --set checkpoint.dir=$TMP/bad/ckpt --set eval.tokenizer=$TMP/no-tok.json
expect_exit eval_tasks_validate_refuses_a_bad_item 2 "eval.tasks\[0\] \(mc\): $TMP/badlabel.jsonl:2: label out of range" -- \
    $UST validate $TMP/c.yaml --set "eval.tasks=[{name: mc, path: $TMP/badlabel.jsonl, every: 2}]"
$UST validate $TMP/c.yaml 2>&1 | grep -q "^eval.tasks\[0\]: mc, 12 items (33 choices), every 2 steps" &&
    pass eval_tasks_validate_reads_them || fail eval_tasks_validate_reads_them "$($UST validate $TMP/c.yaml 2>&1 | tail -2)"
[ ! -d $TMP/bad/ckpt ] && pass eval_tasks_refusals_wrote_nothing || fail eval_tasks_refusals_wrote_nothing "$(ls $TMP/bad/ckpt)"
exit 0
