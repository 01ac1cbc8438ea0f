#!/usr/bin/env bash
# Multiple-choice evaluation (`ustrain eval --task`): a tiny Qwen2 made by transformers scores
# items of {context, choices, label} and llm.c's HellaSwag lines; every choice's log-likelihood
# equals transformers' (1e-4 relative; measured ~1e-7) with the same acc and acc_norm
# predictions; tp=2, pp=2, dp=2 and cp=2 give the one-process scores; bad items exit 2 naming
# file:line.
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/chat_reference.py"
need_py eval_task_needs_torch torch transformers tokenizers || exit 0
$REF make $TMP/t >/dev/null 2>&1 && $REF model $TMP/qwen 640 >$TMP/model.log 2>&1 && $REF mc-items $TMP/mc.jsonl ||
    { fail eval_task_setup "$(tail -2 $TMP/model.log)"; exit 0; }
cp $TMP/t/chatml/tokenizer.json $TMP/qwen/
out=$($UST eval $TMP/qwen --task $TMP/mc.jsonl --scores $TMP/s1.jsonl 2>&1) &&
    echo "$out" | grep -qE "eval: task .*mc.jsonl: 12 items \(33 choices\), acc [0-9.]+ acc_norm [0-9.]+ loglik -[0-9.]+, [0-9.]+ items/s" &&
    out=$($REF mc-check $TMP/qwen $TMP/qwen/tokenizer.json $TMP/mc.jsonl $TMP/s1.jsonl 2>&1) &&
    pass eval_task_scores_equal_transformers || fail eval_task_scores_equal_transformers "$(echo "$out" | tail -3)"
echo "  $(echo "$out" | tail -1)"
for layout in "2 parallel.tp=2" "2 parallel.pp=2" "2 parallel.dp=2" "2 parallel.cp=2"; do
    tag=eval_task_same_scores_$(echo "${layout#* }" | tr '=.' '__')
    scripts/ustrun --nproc-per-node 2 $UST eval $TMP/qwen --task $TMP/mc.jsonl --scores $TMP/s_$tag.jsonl \
        --set ${layout#* } >$TMP/$tag.log 2>&1 &&
        python3 - $TMP/s1.jsonl $TMP/s_$tag.jsonl <<'EOT' && pass $tag || fail $tag "$(tail -2 $TMP/$tag.log)"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 12
for x, y in zip(a, b):
    assert (x["pred"], x["pred_norm"]) == (y["pred"], y["pred_norm"]), (x, y)
    assert all(abs(u - v) <= 1e-5 * abs(u) for u, v in zip(x["loglik"], y["loglik"])), (x, y)
EOT
done

# bad items: file:line and why, exit 2
printf '%s\n' '{"context": "a", "choices": ["b", "c"], "label": 1}' '{"context": "a", "choices": ["b", "c"], "label": 2}' >$TMP/bad1.jsonl
printf '%s\n' '{"context": "a", "choices": ["b"], "label": 0}' >$TMP/bad2.jsonl
printf '%s\n' '' '{"choices": ["b", "c"], "label": 0}' >$TMP/bad3.jsonl
expect_exit eval_task_label_out_of_range 2 "bad1.jsonl:2: label out of range is not a choice's index \(0..1\)" -- \
    $UST eval $TMP/qwen --task $TMP/bad1.jsonl
expect_exit eval_task_one_choice 2 "bad2.jsonl:1: 1 choices \(\"choices\" or \"endings\": at least 2 strings\)" -- \
    $UST eval $TMP/qwen --task $TMP/bad2.jsonl
expect_exit eval_task_no_context 2 "bad3.jsonl:2: no \"context\" \(or \"ctx\"\) string" -- \
    $UST eval $TMP/qwen --task $TMP/bad3.jsonl
expect_exit eval_task_data_or_task 2 "--data and --task: one or the other" -- \
    $UST eval $TMP/qwen --task $TMP/bad3.jsonl --data "$TMP/x_*.bin"
exit 0
