#!/usr/bin/env bash
# A stop signal to ONE rank of a data-parallel job: every rank agrees on the step to stop after,
# the checkpoint is written by all of them, everyone exits 0, and the next start resumes there.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
for sig in TERM USR1; do
    rm -rf $TMP/run
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml --set parallel.dp=2 --set train.steps=100000 \
        --set checkpoint.every=100000 >$TMP/out 2>&1 &
    launcher=$!
    for _ in $(seq 300); do [ "$(cat $TMP/run/metrics.jsonl 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
    one=$(pgrep -P $launcher | tail -1)
    kill -$sig "$one"
    wait $launcher; rc=$?
    step=$(sed 's/step_//' $TMP/run/ckpt/latest 2>/dev/null)
    if [ $rc -eq 0 ] && [ -n "$step" ] && [ "$(grep -c 'received signal' $TMP/out)" = 1 ] &&
       [ -f $TMP/run/ckpt/step_$step/model.safetensors ]; then
        pass dp2_sig${sig}_to_one_rank_stops_all_at_one_step
    else
        fail dp2_sig${sig}_to_one_rank_stops_all_at_one_step "rc=$rc step=$step: $(tail -3 $TMP/out)"
    fi
done
out=$(scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml --set parallel.dp=2 --set train.steps=$((step + 1)) 2>&1)
echo "$out" | grep -q "resuming from .*step_$step" && [ "$(cat $TMP/run/ckpt/latest)" = "step_$((step + 1))" ] &&
    pass dp2_resume_after_signal || fail dp2_resume_after_signal "$(echo "$out" | tail -3)"
