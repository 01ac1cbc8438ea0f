# The Hugging Face family tests' setup and checks (test/sh/hf_families.sh, hf_windows.sh), sourced
# after test/lib.sh: the demo data, $TMP/run.yaml (import, step 0, val on 4 windows of 32) and
# $TMP/eq.yaml (4 steps), $MAKE and $EQ, and roundtrip / versus_transformers / trained_export.

MAKE="python3 test/tools/hf_make_model.py"

$UST data demo $TMP/data >/dev/null
cat >$TMP/run.yaml <<EOT
run:   {name: hf-families, seed: 7}
model: {arch: auto, init_from: null}
train: {steps: 0, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: "$TMP/data/val_*.bin", val_steps: 2}
checkpoint: {dir: $TMP/ckpt}
logging: {metrics_file: $TMP/metrics.jsonl}
EOT
EQ="python3 test/tools/equiv.py --steps 4 --config $TMP/eq.yaml"
sed -e 's/steps: 0/steps: 4/' -e 's/micro_batch_size: 2/micro_batch_size: 1/' \
    -e 's#val: "[^"]*"#val: null#' $TMP/run.yaml >$TMP/eq.yaml

# roundtrip TAG KIND MAKE_OPTS...: a numpy-made directory imports and exports bit-identically
roundtrip() {
    local tag=$1 kind=$2
    shift 2
    $MAKE make $kind $TMP/$tag "$@"
    $UST train $TMP/run.yaml --set model.init_from=$TMP/$tag --set checkpoint.dir=$TMP/$tag-ck \
        >$TMP/$tag.log 2>&1 || { fail ${tag}_imports "$(tail -2 $TMP/$tag.log)"; return; }
    grep -q "step 0: val_loss" $TMP/$tag.log && pass ${tag}_imports ||
        fail ${tag}_imports "no step-0 val_loss: $(tail -2 $TMP/$tag.log)"
    $UST export $TMP/$tag-ck/step_0 --to hf $TMP/$tag-out >/dev/null 2>&1 ||
        { fail ${tag}_exports "export failed"; return; }
    $MAKE compare $tag $TMP/$tag $TMP/$tag-out
}

# loss_both_ways KIND NAME: transformers builds KIND into $TMP/tf-KIND; ustrain's import gives
# transformers' loss (fp32 both sides, the same 128 targets: measured |diff| <= 4.4e-7), and so
# does ustrain's export of that import loaded back into transformers. Sets HF_LOSS.
loss_both_ways() {
    local k=$1 n=$2 d=$TMP/tf-$1
    $MAKE transformers $k $d >$d.make.log 2>&1 || { fail ${n}_transformers_builds "$(tail -1 $d.make.log)"; return 1; }
    local vl
    vl=$($UST train $TMP/run.yaml --set model.init_from=$d --set checkpoint.dir=$d-ck 2>&1 |
        sed -n 's/^step 0: val_loss \([0-9.]*\).*/\1/p')
    [ -z "$vl" ] && { fail ${n}_import_transformers_loss "no val_loss"; return 1; }
    python3 test/tools/hf_export_check.py transformers ${n}_import $d $TMP/data/val_000.bin 4 32 "$vl" 1e-5 2>&1 |
        grep -E '^(PASS|FAIL|  )'
    $UST export $d-ck/step_0 --to hf $d-out >/dev/null 2>&1 || { fail ${n}_reexport "export failed"; return 1; }
    python3 test/tools/hf_export_check.py transformers ${n}_reexport $d-out $TMP/data/val_000.bin 4 32 "$vl" 1e-5 2>&1 |
        grep -E '^(PASS|FAIL|  )'
    HF_LOSS=$vl
}

# versus_transformers KIND: transformers builds KIND; loss, greedy generate, trained exports
versus_transformers() {
    local k=$1 d=$TMP/tf-$1
    loss_both_ways $k $k || return
    greedy_generate $k $d || return
    # 10 steps under dp=2 x tp=2 and pp=2, exported: transformers loads every key and gives the
    # run's step-10 validation loss
    trained_export ${k}_trained_dp2_tp2 $d 4 --set parallel.dp=2 --set parallel.tp=2
    trained_export ${k}_trained_pp2 $d 2 --set parallel.pp=2
}

# trained_export NAME DIR WORLD SETS...: 10 steps from DIR on WORLD ranks, exported, checked
trained_export() {
    local n=$1 d=$2 w=$3
    shift 3
    scripts/ustrun --nproc-per-node $w $UST train $TMP/run.yaml --set model.init_from=$d \
        --set checkpoint.dir=$TMP/$n-ck --set train.steps=10 --set data.val_every=10 \
        --set logging.metrics_file=$TMP/$n.jsonl "$@" >$TMP/$n.log 2>&1 ||
        { fail ${n}_trains "$(tail -2 $TMP/$n.log)"; return; }
    local tl
    tl=$(grep -o '"val_loss":[0-9.]*' $TMP/$n.jsonl | tail -1 | cut -d: -f2)
    [ -z "$tl" ] && { fail ${n}_export_loss "no step-10 val_loss: $(tail -2 $TMP/$n.log)"; return; }
    $UST export $TMP/$n-ck --to hf $TMP/$n-out >/dev/null 2>&1 || { fail ${n}_export "export failed"; return; }
    python3 test/tools/hf_export_check.py transformers $n $TMP/$n-out $TMP/data/val_000.bin 4 32 "$tl" 1e-5 2>&1 |
        grep -E '^(PASS|FAIL|  )'
}


# greedy_generate NAME DIR: greedy generate from transformers' directory DIR gives the same 32
# tokens as transformers' generate
greedy_generate() {
    local k=$1 d=$2 ids
    ids=$(python3 -c 'import sys; print(",".join(str(b) for b in sys.argv[1].encode()))' "Once upon a time")
    $UST generate $d --prompt "Once upon a time" --tokenizer bytes --temperature 0 --max-new-tokens 32 \
        --dump-logits $d.logits >/dev/null 2>$d.gen.log || { fail ${k}_generate "$(tail -1 $d.gen.log)"; return 1; }
    python3 test/tools/generate_check.py transformers ${k}_greedy_generate_matches_transformers $d "$ids" $d.logits 2>&1 |
        grep -E '^(PASS|FAIL)'
}
