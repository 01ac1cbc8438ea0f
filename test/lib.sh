# Helpers for shell tests: pass NAME / fail NAME WHY print the lines test/run.sh counts.
# Every test script runs from the repository root with $UST=./ustrain and a scratch $TMP.
set -u
UST=${UST:-./ustrain}
TMP=$(mktemp -d /tmp/ustrain-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# every python3 a test runs is the project environment's (.venv, built by scripts/venv.sh from
# test/requirements.txt; `make test` builds it), never a package installed by hand
[ -x .venv/bin/python3 ] && PATH="$PWD/.venv/bin:$PATH"
export PYTHONNOUSERSITE=1
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
# need_py NAME MODULE...: python3 imports every MODULE, or a FAIL line names what is missing (a
# missing package is an install step CI would lack: never a SKIP)
need_py() {
    local name=$1
    shift
    python3 -c "import $(echo "$@" | tr ' ' ',')" 2>$TMP/need_py.err && return 0
    fail "$name" "$(command -v python3) cannot import $*: $(tail -1 $TMP/need_py.err) (make venv builds .venv)"
    return 1
}
# expect_exit NAME CODE PATTERN -- cmd...: runs cmd, checks exit code and that stderr+stdout match PATTERN
expect_exit() {
    local name=$1 code=$2 pat=$3; shift 4
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" != "$code" ]; then fail "$name" "exit $rc, expected $code; output: $(echo "$out" | tail -3)"; return 1; fi
    if ! echo "$out" | grep -qE -- "$pat"; then fail "$name" "output does not match /$pat/: $(echo "$out" | tail -3)"; return 1; fi
    pass "$name"
}
# equiv_configs NAME HEADS KV_HEADS: the demo data and the two tiny harness configs
# $TMP/llama.yaml (grouped-query with KV_HEADS) and $TMP/gpt2.yaml (gpt2 has n_kv_head = n_head).
# They name no checkpoint directory: a direct `$UST train` of them sets checkpoint.dir under
# $TMP (or checkpoint.resume=none), or it would resume from a checkout's runs/tiny/ckpt.
equiv_configs() {
    $UST data demo $TMP/data >/dev/null
    cat >$TMP/llama.yaml <<EOT
run:   {name: $1-llama, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: $2, n_kv_head: $3, d_ff: 128, vocab_size: 500, max_seq_len: 64}
train: {seq_len: 32, micro_batch_size: 1, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
EOT
    sed -e 's/arch: llama/arch: gpt2/' -e "s/n_kv_head: $3/n_kv_head: $2/" -e "s/$1-llama/$1-gpt2/" \
        $TMP/llama.yaml >$TMP/gpt2.yaml
}

# plan_matches_arena NAME CONFIG WORLD SETS...: `$UST validate`'s memory plan of rank 0 equals the
# arena peak that training the same settings under scripts/ustrun (WORLD ranks) measures.
plan_matches_arena() {
    local name=$1 cfg=$2 world=$3; shift 3
    local plan got
    plan=$($UST validate $cfg "$@" --world $world | sed -n 's/.*total.*(\([0-9]*\) bytes).*/\1/p')
    scripts/ustrun --nproc-per-node $world $UST train $cfg "$@" \
        --set "logging.metrics_file=$TMP/$name.jsonl" >$TMP/$name.out 2>&1 ||
        { fail $name "run failed: $(tail -2 $TMP/$name.out)"; return; }
    got=$(grep -o '"peak_mem_bytes":[0-9]*' $TMP/$name.jsonl | tail -1 | cut -d: -f2)
    [ -n "$plan" ] && [ "$got" = "$plan" ] && pass $name || fail $name "arena $got bytes, plan $plan"
}

# val_losses CONFIG WORLD SETS...: the validation losses (every 2 steps, 2 micro-batches of
# $TMP/data's val shards) of a 4-step run of CONFIG on WORLD ranks, space-separated
val_losses() {
    local cfg=$1 w=$2; shift 2
    rm -rf $TMP/val
    scripts/ustrun --nproc-per-node $w $UST train $cfg --set checkpoint.resume=none --set "data.val=$TMP/data/val_*.bin" \
        --set data.val_every=2 --set data.val_steps=2 --set train.steps=4 --set checkpoint.every=0 \
        --set "logging.metrics_file=$TMP/val/m.jsonl" "$@" >/dev/null 2>&1
    grep -o '"val_loss":[0-9.]*' $TMP/val/m.jsonl | cut -d: -f2 | tr '\n' ' '
}

# val_losses_equal NAME CONFIG WORLD SETS...: the layout's validation losses (val_losses) equal
# one process's within 1e-5 relative, both runs reporting their two
val_losses_equal() {
    local name=$1 cfg=$2 w=$3; shift 3
    local ref got
    ref=$(val_losses $cfg 1)
    got=$(val_losses $cfg $w "$@")
    if python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); sys.exit(not (len(a) == 2 and len(b) == 2 and all(abs(float(x) - float(y)) <= 1e-5 * abs(float(x)) for x, y in zip(a, b))))" "$ref" "$got"; then
        pass $name
    else
        fail $name "one process: '$ref', $*: '$got'"
    fi
}
# hold_lock DIR: another process holds the flock on DIR (as a running export or data prep does)
# from when this returns until release_lock; waits until it really holds it, not a fixed time
hold_lock() {
    flock -o "$1" sleep 600 &
    LOCK_PID=$!
    for _ in $(seq 1200); do flock -n "$1" true 2>/dev/null || return 0; sleep 0.05; done
}
release_lock() { pkill -P $LOCK_PID sleep; wait $LOCK_PID 2>/dev/null; }
