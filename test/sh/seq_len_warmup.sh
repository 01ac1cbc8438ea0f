#!/usr/bin/env bash
# train.seq_len_warmup (short sequences first, OLMo-core's split rule): each step's sequence length
# is start x 2^n below the linear start + (seq_len - start) x tokens / warmup tokens, and each
# window of seq_len tokens is trained as that many sequences of it (masked apart, positions from
# 0), so the data position and tokens_seen are the run's without a warmup. The steps' lengths
# follow the formula; a first-stage step equals a run of short windows (seq_len 8, 4x the
# sequences) on the same tokens, llama and gpt2 (learned positions), also with documents; a run
# stopped at a stage boundary or inside a stage resumes bit for bit; every layout (dp, ZeRO-3, tp,
# pp, cp ring and Ulysses, four at once) trains the one-process losses, and resumes across
# layouts mid-warmup; bad warmups exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"

need_py seq_len_warmup numpy || exit 0
equiv_configs warm 4 2
# 4 windows of 32 tokens a step: lengths 8 (steps 1-3), 16 (4-8), 32 (9 on)
sed -i -e 's/global_batch_size: 4}/global_batch_size: 4, seq_len_warmup: {start: 8, tokens: 1024}}/' \
    $TMP/llama.yaml $TMP/gpt2.yaml
run() { # run NAME CONFIG SETS...: 10 steps, a checkpoint every step, metrics in $TMP/NAME.jsonl
    local n=$1 cfg=$2
    shift 2
    $UST train $cfg --set train.steps=10 --set checkpoint.dir=$TMP/$n --set checkpoint.every=1 \
        --set checkpoint.keep_last=12 --set logging.metrics_file=$TMP/$n.jsonl "$@" >$TMP/$n.out 2>&1 ||
        echo "run $n failed: $(tail -2 $TMP/$n.out)"
}
run a $TMP/llama.yaml --set checkpoint.resume=none
python3 - $TMP/a.jsonl $TMP/a.out <<'PY' && pass seq_warmup_lengths_and_tokens_follow_the_formula || fail seq_warmup_lengths_and_tokens_follow_the_formula "see above"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
S, T, N, G = 8, 32, 1024, 4
want, prev = [], None
for s in range(10):
    lin = S + (T - S) * (s * G * T) // N  # floor of the linear length
    L = S
    while 2 * L <= min(lin, T):
        L *= 2
    if L != prev:
        want.append((L, s + 1, s * G * T))
    prev = L
got = [tuple(map(int, m)) for m in re.findall(r"sequences of (\d+) tokens from step (\d+) \((\d+) tokens", open(sys.argv[2]).read())]
tok = [r["tokens_seen"] for r in rows]
print("stages", got, "want", want, "tokens_seen", tok)
sys.exit(0 if got == want and len(want) == 3 and tok == [(s + 1) * G * T for s in range(10)] else 1)
PY

# a first-stage step is a step of windows of 8 tokens: the same 128 tokens as 16 sequences
close() { # close A.jsonl B.jsonl N: the first N losses agree to 1e-6 relative
    python3 - "$@" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)][: int(sys.argv[3])] for p in sys.argv[1:3])
print("warmup", a, "short", b)
sys.exit(0 if len(a) == len(b) == int(sys.argv[3]) and all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(a, b)) else 1)
PY
}
short="--set train.seq_len_warmup.start=0 --set train.seq_len=8 --set train.micro_batch_size=4 --set train.global_batch_size=16 --set train.stop_at_step=3"
for arch in llama gpt2; do
    run w$arch $TMP/$arch.yaml --set checkpoint.resume=none --set train.stop_at_step=3
    run s$arch $TMP/$arch.yaml --set checkpoint.resume=none $short
    close $TMP/w$arch.jsonl $TMP/s$arch.jsonl 3 && pass seq_warmup_first_stage_equals_short_windows_$arch ||
        fail seq_warmup_first_stage_equals_short_windows_$arch "see above"
done
# with documents (gpt2: masked apart and positions reset inside each piece too)
docs="--set data.doc_mask=true --set data.reset_positions=true"
run wdoc $TMP/gpt2.yaml --set checkpoint.resume=none --set train.stop_at_step=3 $docs
run sdoc $TMP/gpt2.yaml --set checkpoint.resume=none $short $docs
close $TMP/wdoc.jsonl $TMP/sdoc.jsonl 3 && pass seq_warmup_first_stage_equals_short_windows_with_documents ||
    fail seq_warmup_first_stage_equals_short_windows_with_documents "see above"

# stopped and resumed: at a boundary (step 3 -> 4: 8 -> 16 tokens) and inside a stage (5 -> 6)
losses() { grep -o '"loss":[^,]*' $1 | tail -$2 | tr '\n' ' '; }
for stop in 3 5; do
    run r$stop $TMP/llama.yaml --set checkpoint.resume=none --set train.stop_at_step=$stop
    run r$stop $TMP/llama.yaml --set checkpoint.resume=auto
    [ "$(losses $TMP/a.jsonl 10)" = "$(losses $TMP/r$stop.jsonl 10)" ] && pass seq_warmup_resume_after_step_${stop}_is_bit_for_bit ||
        fail seq_warmup_resume_after_step_${stop}_is_bit_for_bit "straight: $(losses $TMP/a.jsonl 10); resumed: $(losses $TMP/r$stop.jsonl 10)"
done

EQ="python3 test/tools/equiv.py --steps 10"
$EQ --name _seq_warmup --config $TMP/llama.yaml --layout "dp=2" --layout "dp=2 zero=3" --layout "tp=2" \
    --layout "pp=2" --layout "cp=2" --layout "cp=2 parallel.cp_comm=a2a" \
    --layout "dp=2 tp=2 pp=2 cp=2 sp=true zero=1"
$EQ --name _seq_warmup_docs --config $TMP/gpt2.yaml $docs --layout "cp=2" --layout "dp=2 tp=2"
$EQ --name _seq_warmup_resume --config $TMP/llama.yaml --save-layout "dp=2 zero=1" --resume-at 5 \
    --layout "pp=2 tp=2" --layout "dp=1"

# bad warmups: exit 2 naming the key, before anything is built
bad() { # NAME PATTERN SETS...
    local n=$1 p=$2
    shift 2
    expect_exit $n 2 "$p" -- $UST validate $TMP/llama.yaml "$@"
}
bad seq_warmup_start_not_a_power_of_two_part_exits_2 "seq_len_warmup.start \(12\) must be train.seq_len \(32\) / 2\^k" \
    --set train.seq_len_warmup.start=12
bad seq_warmup_start_at_the_target_exits_2 "seq_len_warmup.start \(32\) must be below train.seq_len \(32\)" \
    --set train.seq_len_warmup.start=32
bad seq_warmup_without_tokens_exits_2 "seq_len_warmup.tokens must be > 0" --set train.seq_len_warmup.tokens=0
sed -e 's/start: 8/start: -8/' $TMP/llama.yaml >$TMP/neg.yaml
expect_exit seq_warmup_negative_start_exits_2_with_line_col 2 "neg.yaml:[0-9]+:[0-9]+: train.seq_len_warmup.start: -8" -- \
    $UST validate $TMP/neg.yaml
