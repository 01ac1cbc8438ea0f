#!/usr/bin/env bash
# End-to-end checks of the single-process trainer through the CLI: the demo learns, resume is
# bit-identical to an uninterrupted run, and bad input exits 2 with a clear message without
# touching an existing checkpoint.
. "$(dirname "$0")/../lib.sh"

D=$TMP/data
$UST data demo "$D" >/dev/null || { fail demo_data "ustrain data demo failed"; exit 1; }

# A config file for this test: the tiny default pointed at the scratch directories.
cfg() { # cfg NAME [extra yaml lines...]
    local f=$TMP/$1.yaml; shift
    sed -e "s#data/tiny/#$D/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >"$f"
    for l in "$@"; do echo "$l" >>"$f"; done
    echo "$f"
}
losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }

# --- CLI basics
expect_exit help_exits_0 0 'usage: ustrain' -- $UST --help
expect_exit version_exits_0 0 '^ustrain [0-9]' -- $UST --version
expect_exit unknown_command_exits_2 2 "unknown command 'trian'" -- $UST trian x.yaml
expect_exit missing_config_exits_2 2 'nonexistent.yaml' -- $UST train $TMP/nonexistent.yaml

# --- the demo learns: the loss falls well below its start
C=$(cfg learn)
out=$($UST train "$C" --set train.steps=40 --set checkpoint.every=0 2>&1)
rc=$?
first=$(losses $TMP/run/metrics.jsonl | head -1)
last=$(losses $TMP/run/metrics.jsonl | tail -1)
if [ $rc -eq 0 ] && python3 -c "import sys; a,b=float('$first'),float('$last'); sys.exit(0 if b < 0.5*a else 1)"; then
    pass demo_loss_falls_below_half_of_start
else
    fail demo_loss_falls_below_half_of_start "rc=$rc first=$first last=$last: $(echo "$out" | tail -2)"
fi
grep -q '"val_loss"' $TMP/run/metrics.jsonl && pass metrics_have_val_loss || fail metrics_have_val_loss "no val_loss in metrics"
python3 - "$TMP/run/metrics.jsonl" <<'EOF' && pass metrics_have_the_fixed_keys || fail metrics_have_the_fixed_keys "missing keys"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
need = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_bytes"}
sys.exit(0 if rows and all(need <= set(r) for r in rows) else 1)
EOF
[ -f $TMP/run/config.yaml ] && $UST validate $TMP/run/config.yaml >/dev/null && pass effective_config_written_and_valid || fail effective_config_written_and_valid "no valid $TMP/run/config.yaml"

# --- resume is bit-identical: run 20 steps with checkpoints at 10 and 20; then resume a copy of
# step_10 to step 20 and compare the weights byte for byte and the losses of steps 11-20.
rm -rf $TMP/run
A=$(cfg resume)
run_to_20() { # run_to_20 CKPT_DIR METRICS
    $UST train "$A" --set train.steps=20 --set checkpoint.every=10 --set checkpoint.keep_last=5 \
        --set "checkpoint.dir=$1" --set "logging.metrics_file=$2"
}
run_to_20 $TMP/ckA $TMP/mA.jsonl >/dev/null 2>&1
mkdir -p $TMP/ckB && cp -r $TMP/ckA/step_10 $TMP/ckB/
run_to_20 $TMP/ckB $TMP/mB.jsonl >$TMP/resB.out 2>&1
if grep -q 'resuming from' $TMP/resB.out && cmp -s $TMP/ckA/step_20/model.safetensors $TMP/ckB/step_20/model.safetensors &&
   cmp -s $TMP/ckA/step_20/optimizer.safetensors $TMP/ckB/step_20/optimizer.safetensors; then
    pass resume_gives_bit_identical_weights
else
    fail resume_gives_bit_identical_weights "$(tail -2 $TMP/resB.out)"
fi
if [ "$(losses $TMP/mA.jsonl | tail -10)" = "$(losses $TMP/mB.jsonl | tail -10)" ] && [ "$(losses $TMP/mB.jsonl | wc -l)" = 10 ]; then
    pass resume_continues_the_same_losses
else
    fail resume_continues_the_same_losses "losses differ after resume"
fi
[ "$(cat $TMP/ckA/latest)" = step_20 ] && pass latest_points_to_newest || fail latest_points_to_newest "latest: $(cat $TMP/ckA/latest)"

# --- validation sized in windows (data.val_samples) or tokens (val_tokens) is the same windows
# for every micro-batch size and layout; data.val_steps counts micro-batches, so it is not
V=$(cfg val)
val0() { # val0 SETS...: the step-0 validation loss of the starting weights
    "$@" 2>&1 | grep -o 'step 0: val_loss [0-9.]*' | cut -d' ' -f4
}
vrun="$UST train $V --set train.steps=0 --set checkpoint.resume=none --set checkpoint.every=0"
s1=$(val0 $vrun --set train.micro_batch_size=1 --set data.val_samples=8)
s4=$(val0 $vrun --set train.micro_batch_size=4 --set data.val_samples=8)
t2=$(val0 $vrun --set train.micro_batch_size=2 --set data.val_tokens=1024)
d2=$(val0 scripts/ustrun --nproc-per-node 2 $vrun --set parallel.dp=2 --set train.micro_batch_size=2 --set data.val_samples=8)
k1=$(val0 $vrun --set train.micro_batch_size=1)
k4=$(val0 $vrun --set train.micro_batch_size=4)
python3 -c "import sys; v=[float(x) for x in sys.argv[1:5]]; sys.exit(not (len(sys.argv) == 7 and max(v) - min(v) <= 1e-6 * v[0] and sys.argv[5] != sys.argv[6]))" $s1 $s4 $t2 $d2 $k1 $k4 &&
    pass val_samples_same_for_every_micro_batch_and_layout ||
    fail val_samples_same_for_every_micro_batch_and_layout "val_samples mbs 1/4, val_tokens mbs 2, dp=2: $s1 $s4 $t2 $d2; val_steps mbs 1/4: $k1 $k4"
expect_exit val_samples_not_whole_micro_batches_exits_2 2 'data.val_samples \(6 windows\) must be whole micro-batches of train.micro_batch_size \(4\), e.g. 8' -- \
    $UST validate $V --set data.val_samples=6
expect_exit val_tokens_not_whole_windows_exits_2 2 'data.val_tokens \(1000\) must be whole windows of train.seq_len \(128\), e.g. 1024' -- \
    $UST validate $V --set data.val_tokens=1000
expect_exit val_samples_and_tokens_exits_2 2 'data.val_samples \(8\) and data.val_tokens \(1024\): give one' -- \
    $UST validate $V --set data.val_samples=8 --set data.val_tokens=1024
expect_exit validate_names_the_validation_windows 0 'validation: every 25 steps, 8 windows of 128 tokens = 2 micro-batches \(data.val_samples\)' -- \
    $UST validate $V --set data.val_samples=8

# --- run.out_dir scopes a run: checkpoint.dir and logging.metrics_file default under it, and it
# defaults to runs/<run.name>, so two configs that set none of them never share a checkpoint
mkdir -p $TMP/scope && cat >$TMP/scope/a.yaml <<EOT
run:   {name: alpha, seed: 1}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 2, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
data:  {train: "$D/train_*.bin", val: "$D/val_*.bin", val_steps: 1}
checkpoint: {every: 2}
EOT
sed 's/name: alpha/name: beta/' $TMP/scope/a.yaml >$TMP/scope/b.yaml
UABS=$(cd "$(dirname "$UST")" && pwd)/$(basename "$UST")
(cd $TMP/scope && $UABS train a.yaml >a.log 2>&1 && $UABS train b.yaml >b.log 2>&1)
[ -d $TMP/scope/runs/alpha/ckpt/step_2 ] && [ -d $TMP/scope/runs/beta/ckpt/step_2 ] &&
    [ -s $TMP/scope/runs/beta/metrics.jsonl ] && ! grep -q resuming $TMP/scope/b.log &&
    pass run_name_scopes_checkpoints_and_metrics ||
    fail run_name_scopes_checkpoints_and_metrics "$(cd $TMP/scope && find runs | sort | tr '\n' ' '; tail -1 b.log)"
(cd $TMP/scope && $UABS train a.yaml --set run.out_dir=elsewhere >c.log 2>&1)
[ -d $TMP/scope/elsewhere/ckpt/step_2 ] && [ -s $TMP/scope/elsewhere/metrics.jsonl ] &&
    ! grep -q resuming $TMP/scope/c.log && pass run_out_dir_scopes_checkpoints_and_metrics ||
    fail run_out_dir_scopes_checkpoints_and_metrics "$(cd $TMP/scope && find elsewhere | tr '\n' ' '; tail -1 c.log)"
# another run's checkpoint in the same checkpoint.dir: auto refuses naming what differs, and
# leaves it as it was; named in checkpoint.resume it is taken
sum0=$(find $TMP/scope/runs/alpha/ckpt -type f ! -name .lock | sort | xargs md5sum | md5sum)
expect_exit resume_auto_of_another_runs_checkpoint_exits_2 2 "another run's: run.name 'beta' \(the checkpoint's 'alpha'\)" -- \
    $UST train $TMP/scope/b.yaml --set train.steps=4 --set checkpoint.dir=$TMP/scope/runs/alpha/ckpt
[ "$(find $TMP/scope/runs/alpha/ckpt -type f ! -name .lock | sort | xargs md5sum | md5sum)" = "$sum0" ] &&
    pass resume_refused_leaves_the_checkpoint || fail resume_refused_leaves_the_checkpoint "changed"
# the same run.name and shape on other data is another run's too; a blend of the same datasets
# with other weights is not (data.allow_reweight continues it)
cp -r $D $TMP/scope/d2
expect_exit resume_auto_on_other_data_exits_2 2 "another run's: data.train $TMP/scope/d2/train_\*.bin \(the checkpoint's $D/train_\*.bin\)" -- \
    $UST train $TMP/scope/a.yaml --set train.steps=4 --set checkpoint.dir=$TMP/scope/runs/alpha/ckpt --set "data.train=$TMP/scope/d2/train_*.bin"
expect_exit resume_named_of_another_runs_checkpoint_is_taken 0 "resuming from .*alpha/ckpt/step_2" -- \
    $UST train $TMP/scope/b.yaml --set train.steps=3 --set checkpoint.dir=$TMP/scope/other \
    --set checkpoint.resume=$TMP/scope/runs/alpha/ckpt/step_2

# --- bad input: exit 2 with a message, existing checkpoint untouched
# (every file but .lock, which names the job that last held the directory)
sum_before=$(cd $TMP/ckA && find . -type f ! -name .lock -exec md5sum {} + | sort | md5sum)
# auto: another shape is another run's checkpoint, refused by name before any tensor is read;
# named in checkpoint.resume: the loader's check names the tensor
expect_exit checkpoint_shape_mismatch_exits_2 2 "another run's: model.d_model 64 \(the checkpoint's 128\)" -- \
    $UST train "$A" --set model.d_model=64 --set train.steps=30 --set "checkpoint.dir=$TMP/ckA"
expect_exit checkpoint_named_shape_mismatch_exits_2 2 "tensor 'model.embed_tokens.weight'.*shape" -- \
    $UST train "$A" --set model.d_model=64 --set train.steps=30 --set "checkpoint.dir=$TMP/ckA" \
    --set "checkpoint.resume=$TMP/ckA/step_20"
sum_after=$(cd $TMP/ckA && find . -type f ! -name .lock -exec md5sum {} + | sort | md5sum)
[ "$sum_before" = "$sum_after" ] && pass bad_resume_leaves_checkpoint_untouched || fail bad_resume_leaves_checkpoint_untouched "checkpoint directory changed"

B=$(cfg bad1 "bogus_section: {a: 1}")
expect_exit unknown_section_exits_2_with_position 2 "bad1.yaml:[0-9]+:[0-9]+" -- $UST train "$B"
printf 'train:\n  micro_batch: 4\n' >$TMP/bad2.yaml
expect_exit unknown_key_did_you_mean 2 "bad2.yaml:2:3.*did you mean 'micro_batch_size'" -- $UST train $TMP/bad2.yaml
printf 'train: {steps: 5, steps: 6}\n' >$TMP/bad3.yaml
expect_exit duplicate_key_exits_2 2 "bad3.yaml:1:.*duplicate" -- $UST train $TMP/bad3.yaml
expect_exit bad_set_value_exits_2 2 "train.steps" -- $UST train "$C" --set train.steps=abc
expect_exit seq_longer_than_max_exits_2 2 "seq_len" -- $UST train "$C" --set train.seq_len=512
expect_exit world_mismatch_exits_2 2 "dp" -- $UST validate "$C" --set parallel.dp=2 --world 3

head -c 2000 $D/train_000.bin >$TMP/trunc_000.bin
expect_exit truncated_shard_exits_2 2 "trunc_000.bin.*truncated" -- $UST train "$C" --set "data.train=$TMP/trunc_*.bin" --set checkpoint.every=0
head -c 5000 /dev/urandom >$TMP/foreign_000.bin
expect_exit foreign_shard_exits_2 2 "foreign_000.bin.*magic" -- $UST train "$C" --set "data.train=$TMP/foreign_*.bin" --set checkpoint.every=0
expect_exit token_outside_vocab_exits_2 2 "vocab" -- $UST train "$C" --set model.vocab_size=200 --set checkpoint.every=0
expect_exit empty_glob_exits_2 2 "nothing_here" -- $UST train "$C" --set "data.train=$TMP/nothing_here_*.bin"
expect_exit bad_init_from_exits_2 2 "llm.c" -- $UST train "$C" --set model.arch=gpt2 --set model.n_kv_head=4 --set "model.init_from=$D/train_000.bin" --set checkpoint.resume=none --set checkpoint.every=0
expect_exit cuda_without_backend_exits_2 2 "cuda" -- $UST train "$C" --set run.device=cuda --set checkpoint.every=0
touch $TMP/afile
expect_exit checkpoint_dir_under_a_file_exits_2 2 "afile" -- $UST train "$C" --set "checkpoint.dir=$TMP/afile/ck"

# --- validate prints the memory plan without training
out=$($UST validate "$C" 2>&1)
echo "$out" | grep -q 'memory plan per rank' && echo "$out" | grep -q 'optimizer' && pass validate_prints_memory_plan || fail validate_prints_memory_plan "$out"
# validate runs train's own pre-flight checks (train_check_runnable, the datasets opened as
# train opens them): what train refuses before allocating, validate refuses with the same words
expect_exit validate_refuses_bf16_on_cpu_like_train 2 "bf16: the CPU backend" -- $UST validate "$C" --set train.precision=bf16
expect_exit validate_refuses_truncated_shard_like_train 2 "trunc_000.bin.*truncated" -- $UST validate "$C" --set "data.train=$TMP/trunc_*.bin"
expect_exit validate_refuses_metrics_inside_a_step 2 "logging.metrics_file" -- $UST validate "$C" --set "logging.metrics_file=$TMP/ckA/step_10/m.jsonl"
echo "$out" | grep -q "^outputs: checkpoints $TMP/run/ckpt .*metrics $TMP/run/metrics.jsonl, tensorboard none" &&
    echo "$out" | grep -q '^rope: theta 10000' && echo "$out" | grep -q "^data.train: $D/train_\*.bin (weight 1)" &&
    pass validate_prints_outputs_rope_and_blend || fail validate_prints_outputs_rope_and_blend "$(echo "$out" | head -8)"

# --- SIGTERM (and Slurm's SIGUSR1) finish the step, write a checkpoint and exit 0; the next
# start resumes there.
for sig in TERM USR1; do
    rm -rf $TMP/sig
    $UST train "$C" --set train.steps=100000 --set checkpoint.every=100000 \
        --set "checkpoint.dir=$TMP/sig/ck" --set "logging.metrics_file=$TMP/sig/m.jsonl" >$TMP/sig.out 2>&1 &
    pid=$!
    for _ in $(seq 300); do [ "$(cat $TMP/sig/m.jsonl 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
    kill -$sig $pid
    wait $pid; rc=$?
    step=$(sed 's/step_//' $TMP/sig/ck/latest 2>/dev/null)
    if [ $rc -eq 0 ] && [ -n "$step" ] && [ "$step" -ge 3 ] && grep -q "received signal" $TMP/sig.out; then
        pass sig${sig}_checkpoints_and_exits_0
    else
        fail sig${sig}_checkpoints_and_exits_0 "rc=$rc step=$step: $(tail -2 $TMP/sig.out)"
    fi
done
out=$($UST train "$C" --set train.steps=$((step + 2)) --set "checkpoint.dir=$TMP/sig/ck" --set "logging.metrics_file=$TMP/sig/m2.jsonl" 2>&1)
if echo "$out" | grep -q "resuming from .*step_$step" && [ "$(cat $TMP/sig/ck/latest)" = "step_$((step + 2))" ]; then
    pass resume_after_signal_continues
else
    fail resume_after_signal_continues "$(echo "$out" | tail -2)"
fi

# --- data prep: text files -> byte-level llm.c shards the trainer reads
for i in 1 2 3; do cat README.md docs/*.md 2>/dev/null; done >$TMP/corpus.txt
cp configs/tiny.yaml $TMP/corpus2.txt
if $UST data prep --out $TMP/prep $TMP/corpus.txt $TMP/corpus2.txt >/dev/null 2>&1 && ls $TMP/prep/train_*.bin >/dev/null 2>&1 &&
   $UST train "$C" --set "data.train=$TMP/prep/train_*.bin" --set "data.val=$TMP/prep/val_*.bin" \
       --set train.steps=2 --set checkpoint.every=0 --set "logging.metrics_file=$TMP/prep/m.jsonl" >/dev/null 2>&1; then
    pass data_prep_shards_train
else
    fail data_prep_shards_train "prep or training on its shards failed"
fi
expect_exit data_prep_missing_input_exits_2 2 "no_such_file" -- $UST data prep --out $TMP/prep2 $TMP/no_such_file.txt

# --- layouts that cannot split the model are refused before training, on every rank
expect_exit pp_split_refused_in_train_exits_2 2 "must be divisible by parallel.pp" -- scripts/ustrun --nproc-per-node 3 $UST train "$C" --set parallel.pp=3 --set checkpoint.every=0
expect_exit world_mismatch_in_train_exits_2 2 "world has 1 ranks" -- $UST train "$C" --set parallel.dp=2 --set checkpoint.every=0

# --- validate --schedule prints every pipeline rank's actions and the simulated bubble
out=$($UST validate "$C" --set parallel.pp=2 --set train.global_batch_size=16 --schedule 2>&1)
echo "$out" | grep -q "SEND_ACT mb=3 stage=0 to=1" && echo "$out" | grep -q "simulated bubble 0.2500 (analytic (p-1)/(v\*m) = 0.2500" &&
    pass validate_prints_the_pipeline_schedule || fail validate_prints_the_pipeline_schedule "$(echo "$out" | tail -2)"
# dualpipe/dualpipev hold two stages per rank: vpp left out is implied (2) and validate says so;
# the bundled tiny.yaml leaves vpp out, so --set pp_schedule alone is enough
for s in dualpipe dualpipev; do
    expect_exit "${s}_implies_vpp_2_and_validate_says_so" 0 "parallel.vpp: 2, implied by pp_schedule: $s" -- \
        $UST validate "$C" --set parallel.pp=2 --set parallel.pp_schedule=$s --set train.global_batch_size=16 --world 2
done
expect_exit interleaved_needs_m_multiple_of_p_exits_2 2 "interleaved" -- \
    $UST validate "$C" --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_schedule=interleaved --set train.global_batch_size=12 --schedule

# --- every bundled config is valid for the world size its layout needs
for f in configs/*.yaml; do
    world=$(python3 - "$f" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
w = 1
for k in ("dp", "tp", "pp", "cp"):
    m = re.search(r"\b%s:\s*(\d+)" % k, text.split("parallel:")[1].split("\n")[0]) if "parallel:" in text else None
    w *= int(m.group(1)) if m else 1
print(w)
PY
)
    S=() # hf-tiny.yaml and sft-tiny.yaml import a Hugging Face directory: the worked examples of docs/huggingface.md make one
    if [ "$(basename "$f")" = hf-tiny.yaml ] || [ "$(basename "$f")" = sft-tiny.yaml ]; then
        [ -d $TMP/hf-model ] || python3 test/tools/hf_make_model.py make llama $TMP/hf-model >/dev/null 2>&1
        S=(--set model.init_from=$TMP/hf-model)
        # that model's 64 positions (the example's own Qwen2 has 256); no data here to give the eot id
        [ "$(basename "$f")" = sft-tiny.yaml ] && S+=(--set train.seq_len=64 --set data.eot_id=0)
    fi
    $UST validate "$f" "${S[@]}" --world "$world" >/dev/null 2>&1 && pass "bundled_config_valid_$(basename "$f" .yaml)" ||
        fail "bundled_config_valid_$(basename "$f" .yaml)" "$($UST validate "$f" "${S[@]}" --world "$world" 2>&1 | tail -1)"
done

# --- bench train --profile: time per op of the timed steps. The tiny config's 4 layers and 2
# micro-batches per step make 8 attention forwards per step; the ops' total lies within the
# step's time (each op is part of a step); only bench train takes the flag.
C=$(cfg prof)
$UST bench train "$C" --steps 2 --profile >$TMP/prof.out 2>&1
rc=$?
awk -v rc=$rc '/^attention_fwd / { att = $2 } /^total / { tot = $2 }
     /^  step: / { step = $2 }
     END { if (rc == 0 && att == "8.0" && tot > 0 && step > 0 && tot <= step)
               print "PASS bench_train_profile_counts_ops_within_the_step";
           else printf "FAIL bench_train_profile_counts_ops_within_the_step: exit %d, attention_fwd %s/step, ops %s ms of a %s ms step\n", rc, att, tot, step }' $TMP/prof.out
expect_exit profile_is_a_bench_option 2 'unknown option --profile' -- $UST train "$C" --profile
