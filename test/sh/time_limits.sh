#!/usr/bin/env bash
# Time limits: train.stop_at_step and train.exit_after_min checkpoint at the step boundary and exit
# 0 (every rank after the same step), and the next start resumes there: the stopped-and-resumed
# run trains exactly the uninterrupted one.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/RUN#g" configs/tiny.yaml >$TMP/c.yaml
T="--set train.steps=6 --set checkpoint.every=100"
sed "s#RUN#full#g" $TMP/c.yaml >$TMP/full.yaml
sed "s#RUN#cut#g" $TMP/c.yaml >$TMP/cut.yaml
$UST train $TMP/full.yaml $T >$TMP/full.log 2>&1 || fail time_limits_reference "$(tail -2 $TMP/full.log)"
expect_exit stop_at_step_exits_0_with_a_checkpoint 0 "train.stop_at_step reached: stopped after step 3, checkpoint written" -- \
    $UST train $TMP/cut.yaml $T --set train.stop_at_step=3
[ "$(cat $TMP/cut/ckpt/latest 2>/dev/null)" = step_3 ] && pass stop_at_step_checkpoint_is_latest ||
    fail stop_at_step_checkpoint_is_latest "latest: $(cat $TMP/cut/ckpt/latest 2>/dev/null)"
$UST train $TMP/cut.yaml $T >$TMP/cut.log 2>&1 || fail stop_at_step_resume "$(tail -2 $TMP/cut.log)"
a=$(grep -o '"loss":[^,]*' $TMP/full/metrics.jsonl | tr '\n' ' ')
b=$(grep -o '"loss":[^,]*' $TMP/cut/metrics.jsonl | tr '\n' ' ')
[ -n "$a" ] && [ "$a" = "$b" ] && cmp -s $TMP/full/ckpt/step_6/model.safetensors $TMP/cut/ckpt/step_6/model.safetensors &&
    pass stop_and_resume_trains_the_uninterrupted_model || fail stop_and_resume_trains_the_uninterrupted_model "$a / $b"
# a time limit of 0.3 s over two data-parallel ranks: both stop after the same step, exit 0
sed "s#RUN#timed#g" $TMP/c.yaml >$TMP/timed.yaml
scripts/ustrun --nproc-per-node 2 $UST train $TMP/timed.yaml --set parallel.dp=2 --set train.steps=100000 \
    --set checkpoint.every=100000 --set train.exit_after_min=0.005 >$TMP/timed.log 2>&1
rc=$?
step=$(sed 's/step_//' $TMP/timed/ckpt/latest 2>/dev/null)
[ $rc = 0 ] && [ -n "$step" ] && grep -q "time limit (train.exit_after_min) reached: stopped after step $step, checkpoint written" $TMP/timed.log &&
    [ -f $TMP/timed/ckpt/step_$step/model.safetensors ] && pass exit_after_min_stops_every_rank_at_one_step ||
    fail exit_after_min_stops_every_rank_at_one_step "rc=$rc step=$step: $(tail -3 $TMP/timed.log)"
expect_exit exit_after_min_negative_exits_2 2 "train.exit_after_min" -- $UST validate $TMP/c.yaml --set train.exit_after_min=-1
expect_exit stop_at_step_negative_exits_2 2 "train.stop_at_step" -- $UST validate $TMP/c.yaml --set train.stop_at_step=-2
exit 0
