#!/usr/bin/env bash
# Long operations show their progress on a terminal (core/base/progress.c): a plan's search, a
# checkpoint save, an export and a Hugging Face import each rewrite one line in place on stderr
# when it is a terminal (a pseudo-terminal from script(1) here; UST_PROGRESS_DELAY_S=0 shows it at
# once instead of after 1 s), and write nothing of it into a log or a pipe.
. "$(dirname "$0")/../lib.sh"

command -v script >/dev/null || { fail progress_needs_script "script(1) (util-linux) is missing"; exit 0; }
D=$TMP/data
$UST data demo $D >/dev/null
sed -e "s#data/tiny/#$D/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
export UST_PROGRESS_DELAY_S=0
on_tty() { # on_tty LOG CMD...: CMD's output through a pseudo-terminal into LOG
    local log=$1; shift
    script -qec "$(printf '%q ' "$@")" /dev/null >$log 2>&1
}
shows() { # shows NAME LOG TEXT: LOG holds TEXT as a progress line (a carriage return before it)
    if tr '\r' '\n' <$2 | grep -q "^$3 .*%"; then pass $1; else fail $1 "no '$3 N%' line: $(head -c 300 $2 | od -c | head -3)"; fi
}
on_tty $TMP/plan.log $UST plan $TMP/c.yaml --world 64
shows progress_plan_search_on_a_terminal $TMP/plan.log "plan: searching layouts"
$UST plan $TMP/c.yaml --world 64 >$TMP/plan2.log 2>&1
! grep -q "searching layouts" $TMP/plan2.log && pass progress_plan_nothing_into_a_log ||
    fail progress_plan_nothing_into_a_log "$(grep -c searching $TMP/plan2.log) lines"
on_tty $TMP/train.log $UST train $TMP/c.yaml --set train.steps=2 --set checkpoint.every=2
shows progress_checkpoint_save_on_a_terminal $TMP/train.log "checkpoint: writing"
on_tty $TMP/export.log $UST export $TMP/run/ckpt --to hf $TMP/hf
shows progress_export_on_a_terminal $TMP/export.log "export: writing"
on_tty $TMP/import.log $UST train $TMP/c.yaml --set train.steps=1 --set checkpoint.every=0 \
    --set checkpoint.resume=none --set model.init_from=$TMP/hf --set model.arch=auto
shows progress_import_on_a_terminal $TMP/import.log "import: reading"
$UST train $TMP/c.yaml --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir=$TMP/ck2 >$TMP/train2.log 2>&1
! grep -q "checkpoint: writing" $TMP/train2.log && pass progress_checkpoint_nothing_into_a_log ||
    fail progress_checkpoint_nothing_into_a_log "$(grep -c writing $TMP/train2.log) lines"
exit 0
