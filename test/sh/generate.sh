#!/usr/bin/env bash
# `ustrain generate`: tiny llama (grouped-query), gpt2 (learned positions, a prompt longer than one
# prefill chunk), a llama with experts and a shared expert in every layer, a Mixtral-shaped one
# and a Qwen2-like llama (q/k/v biases, llama3 rope scaling, tied embeddings) are trained for a
# few steps; greedy generation with the KV cache must give, at every step, the logits an
# independent numpy forward of the whole sequence without a cache computes
# (test/tools/generate_check.py), and where torch and transformers are installed, the exported
# model's (llama, gpt2, Mixtral, Qwen2-like) generate(do_sample=False) must pick the same tokens
#. Sampling is a pure function of the seed; max_seq_len stops generation
# with a note; bad input exits 2 before the weights are read.
. "$(dirname "$0")/../lib.sh"

CHECK="python3 test/tools/generate_check.py"
need_py generate_python_deps numpy safetensors || exit 0

$UST data demo $TMP/data >/dev/null
cat >$TMP/template.yaml <<EOT
run:   {name: gen, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 6, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {dir: $TMP/RUN/ckpt, every: 6}
logging: {metrics_file: $TMP/RUN/metrics.jsonl}
EOT
# train TAG SED: trains $TMP/TAG from the template edited by SED
train() {
    sed -e "s#RUN#$1#g" -e "$2" $TMP/template.yaml >$TMP/$1.yaml
    $UST train $TMP/$1.yaml >$TMP/$1.log 2>&1 || { fail ${1}_trains "$(tail -2 $TMP/$1.log)"; return 1; }
}
ids_of() { python3 -c 'import sys; print(",".join(str(b) for b in sys.argv[1].encode()))' "$1"; }

PROMPT="Once upon a time, the"
LONG=$(python3 -c 'print(("the quick brown fox jumps over the lazy dog. " * 4)[:150])')
train llama 's/x/x/'
train gpt2 's/arch: llama/arch: gpt2/; s/max_seq_len: 64/max_seq_len: 192/'
train moe 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 48, shared_expert: true}}/'
train mixtral 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 48}}/'
train qwen 's/max_seq_len: 64}/max_seq_len: 64, qkv_bias: true, tie_embeddings: true, rope_theta: 500000, rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 16}}/'

# greedy with the cache against the numpy forward without one, every step
for t in llama gpt2 moe mixtral qwen; do
    p="$PROMPT"
    [ $t = gpt2 ] && p="$LONG" # 150 tokens: two prefill chunks of 128 and 22
    if ! $UST generate $TMP/$t/ckpt --prompt "$p" --tokenizer bytes --temperature 0 --max-new-tokens 16 \
        --dump-logits $TMP/$t.logits >$TMP/$t.out 2>$TMP/$t.err; then
        fail generate_${t}_greedy_matches_reference "exit $?: $(tail -2 $TMP/$t.err)"
        continue
    fi
    $CHECK reference generate_${t}_greedy_matches_reference $TMP/$t/ckpt/step_6 "$(ids_of "$p")" $TMP/$t.logits
done
grep -qE "^generate: 21 prompt tokens, 16 new tokens, prefill [0-9.]+ s .*decode [0-9.]+ tokens/s" $TMP/llama.err &&
    pass generate_reports_counts_and_speed_on_stderr || fail generate_reports_counts_and_speed_on_stderr "$(cat $TMP/llama.err)"

# the streamed text is the greedy tokens' bytes (byte tokenizer: id = byte), plus a newline
python3 - "$TMP/llama.out" "$TMP/llama.logits" <<'EOF' && pass generate_prints_the_picked_tokens || fail generate_prints_the_picked_tokens "stdout differs"
import sys, numpy as np
ids = np.fromfile(sys.argv[2], dtype=np.float32).reshape(-1, 300).argmax(1)
sys.exit(0 if open(sys.argv[1], "rb").read() == bytes(int(i) for i in ids if i < 256) + b"\n" else 1)
EOF

# sampling: a seed gives one text; another seed another
gen() { $UST generate $TMP/llama/ckpt --prompt "$PROMPT" --tokenizer bytes --max-new-tokens 24 "$@" 2>/dev/null; }
a=$(gen --seed 1 --temperature 1.0 --top-k 0 | od -An -tx1)
b=$(gen --seed 1 --temperature 1.0 --top-k 0 | od -An -tx1)
c=$(gen --seed 2 --temperature 1.0 --top-k 0 | od -An -tx1)
[ -n "$a" ] && [ "$a" = "$b" ] && pass generate_same_seed_same_sample || fail generate_same_seed_same_sample "$a vs $b"
[ "$a" != "$c" ] && pass generate_other_seed_other_sample || fail generate_other_seed_other_sample "seeds 1 and 2 gave $a"
# top-k 1 is greedy whatever the temperature and seed
g=$(gen --temperature 0 | od -An -tx1)
k1=$(gen --seed 5 --temperature 2 --top-k 1 | od -An -tx1)
[ "$g" = "$k1" ] && pass generate_top_k_1_is_greedy || fail generate_top_k_1_is_greedy "$g vs $k1"

# max_seq_len: a 60-token prompt in a 64-position model leaves room for 5 new tokens, then a note
p60=$(python3 -c 'print("a" * 60)')
$UST generate $TMP/llama/ckpt --prompt "$p60" --tokenizer bytes --temperature 0 --max-new-tokens 20 >/dev/null 2>$TMP/limit.err
grep -q "60 prompt tokens, 5 new tokens" $TMP/limit.err && grep -q "stopped at the model's max_seq_len (64" $TMP/limit.err &&
    pass generate_stops_at_max_seq_len || fail generate_stops_at_max_seq_len "$(cat $TMP/limit.err)"

# the checkpoint directory stands for its newest step, a step directory for itself
s1=$($UST generate $TMP/llama/ckpt/step_6 --prompt "$PROMPT" --tokenizer bytes --temperature 0 --max-new-tokens 8 2>/dev/null | od -An -tx1)
s2=$($UST generate $TMP/llama/ckpt --prompt "$PROMPT" --tokenizer bytes --temperature 0 --max-new-tokens 8 2>/dev/null | od -An -tx1)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && pass generate_checkpoint_dir_takes_newest_step || fail generate_checkpoint_dir_takes_newest_step "$s1 vs $s2"
printf '%s' "$PROMPT" >$TMP/prompt.txt
s3=$($UST generate $TMP/llama/ckpt --prompt-file $TMP/prompt.txt --tokenizer bytes --temperature 0 --max-new-tokens 8 2>/dev/null | od -An -tx1)
[ "$s3" = "$s2" ] && pass generate_prompt_file_equals_prompt || fail generate_prompt_file_equals_prompt "$s3 vs $s2"

# the checkpoint's tokenizer record ("tokenizer": {"path", "eot_id"}) stands in for --tokenizer,
# and generation stops at its end-of-text id: with the greedy first token as eot, nothing comes
first=$(python3 -c 'import sys, numpy as np; print(int(np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 300)[0].argmax()))' $TMP/llama.logits)
record() { # record DIR EOT: a copy of llama's step_6 whose state.json names the byte tokenizer
    rm -rf $1 && cp -r $TMP/llama/ckpt/step_6 $1 && python3 - $1/state.json $2 <<'EOF2'
import json, sys
s = json.load(open(sys.argv[1]))
s["tokenizer"] = {"path": "bytes", "sha256": "", "eot_id": int(sys.argv[2])}
json.dump(s, open(sys.argv[1], "w"))
EOF2
    python3 test/tools/reseal.py $1
}
record $TMP/rec 256
r1=$($UST generate $TMP/rec --prompt "$PROMPT" --temperature 0 --max-new-tokens 8 2>/dev/null | od -An -tx1)
[ -n "$r1" ] && [ "$r1" = "$s2" ] && pass generate_uses_the_checkpoints_tokenizer_record || fail generate_uses_the_checkpoints_tokenizer_record "$r1 vs $s2"
record $TMP/rec-eot $first
$UST generate $TMP/rec-eot --prompt "$PROMPT" --temperature 0 --max-new-tokens 8 >$TMP/eot.out 2>$TMP/eot.err
grep -q "21 prompt tokens, 0 new tokens" $TMP/eot.err && [ "$(cat $TMP/eot.out)" = "" ] &&
    pass generate_stops_at_end_of_text || fail generate_stops_at_end_of_text "$(cat $TMP/eot.err)"

# --- transformers: the exported model's greedy generate picks the same tokens
if need_py generate_matches_transformers torch transformers; then
    for t in llama gpt2 mixtral qwen; do
        p="$PROMPT"
        [ $t = gpt2 ] && p="$LONG"
        $UST export $TMP/$t/ckpt --to hf $TMP/$t-hf >/dev/null 2>&1 || { fail generate_${t}_matches_transformers "export failed"; continue; }
        OMP_NUM_THREADS=1 $CHECK transformers generate_${t}_matches_transformers $TMP/$t-hf "$(ids_of "$p")" $TMP/$t.logits 2>&1 | grep -E '^(PASS|FAIL)'
    done
fi

# --- bad input: exit 2 with the reason
CK=$TMP/llama/ckpt
# --dump-logits at a path that cannot take it exits 2 at start, before the weights are read, with
# the reason: a FIFO without a reader (it hung), a directory, a missing directory, an empty path,
# a read-only file system (a tmpfs mounted read-only in a private mount namespace)
mkdir -p $TMP/outs && rm -f $TMP/outs/fifo && mkfifo $TMP/outs/fifo
G="timeout -k 5 30 $UST generate $CK --prompt hi --tokenizer bytes --max-new-tokens 2 --dump-logits"
expect_exit generate_dump_logits_fifo_exits_2 2 "dump-logits .*outs/fifo: not a regular file \(a FIFO\)" -- $G $TMP/outs/fifo
expect_exit generate_dump_logits_directory_exits_2 2 "dump-logits .*outs: not a regular file \(a directory\)" -- $G $TMP/outs
expect_exit generate_dump_logits_missing_dir_exits_2 2 "dump-logits .*nodir/x.bin: cannot create: the directory .*outs/nodir does not exist" -- \
    $G $TMP/outs/nodir/x.bin
expect_exit generate_dump_logits_empty_path_exits_2 2 "dump-logits an empty path" -- $G ""
if unshare -m true 2>/dev/null; then
    mkdir -p $TMP/ro
    expect_exit generate_dump_logits_read_only_fs_exits_2 2 "dump-logits .*ro/x.bin: cannot open: Read-only file system" -- \
        unshare -m bash -c 'mount -t tmpfs -o ro,size=64k none "$0" && exec "$@"' $TMP/ro $G $TMP/ro/x.bin
fi
expect_exit generate_missing_checkpoint_exits_2 2 "nonexistent.*No such file" -- \
    $UST generate $TMP/nonexistent --prompt hi --tokenizer bytes
mkdir -p $TMP/empty
expect_exit generate_not_a_checkpoint_exits_2 2 "is not a checkpoint" -- $UST generate $TMP/empty --prompt hi --tokenizer bytes
expect_exit generate_empty_prompt_exits_2 2 "the prompt is empty" -- $UST generate $CK --prompt "" --tokenizer bytes
p65=$(python3 -c 'print("a" * 65)')
expect_exit generate_prompt_longer_than_max_seq_len_exits_2 2 "the prompt is 65 tokens, more than the model's max_seq_len 64" -- \
    $UST generate $CK --prompt "$p65" --tokenizer bytes
# the demo data's meta.json makes training record the byte tokenizer: a checkpoint without the
# record (as from shards without meta.json) needs --tokenizer
rm -rf $TMP/norec && cp -r $CK/step_6 $TMP/norec && python3 - $TMP/norec/state.json <<'EOF2'
import json, sys
s = json.load(open(sys.argv[1]))
s.pop("tokenizer", None)
json.dump(s, open(sys.argv[1], "w"))
EOF2
python3 test/tools/reseal.py $TMP/norec
expect_exit generate_without_tokenizer_exits_2 2 "does not record its tokenizer.*--tokenizer" -- $UST generate $TMP/norec --prompt hi
# a byte-level BPE tokenizer whose ids start at 100: every byte above 199 (as in Cyrillic) is outside the
# model's 300-token vocabulary
python3 - $TMP/shifted.json <<'EOF'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): 100 + b for b, c in zip(bs, cs)}
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "added_tokens": []}, open(sys.argv[1], "w"))
EOF
expect_exit generate_prompt_ids_outside_vocab_exit_2 2 "prompt token 0 is id 309, outside the model's vocabulary of 300" -- \
    $UST generate $CK --prompt "шум" --tokenizer $TMP/shifted.json
expect_exit generate_bad_tokenizer_file_exits_2 2 "not valid JSON" -- $UST generate $CK --prompt hi --tokenizer $TMP/template.yaml
expect_exit generate_bad_temperature_exits_2 2 "--temperature abc: expected a number in \[0, 100\]" -- \
    $UST generate $CK --prompt hi --tokenizer bytes --temperature abc
expect_exit generate_bad_top_p_exits_2 2 "--top-p 0: expected a number in \(0, 1\]" -- $UST generate $CK --prompt hi --tokenizer bytes --top-p 0
expect_exit generate_bad_max_new_tokens_exits_2 2 "--max-new-tokens 0: expected 1\.\." -- \
    $UST generate $CK --prompt hi --tokenizer bytes --max-new-tokens 0
expect_exit generate_bad_top_k_exits_2 2 "--top-k -1: expected 0\.\." -- $UST generate $CK --prompt hi --tokenizer bytes --top-k -1
expect_exit generate_bad_device_exits_2 2 "--device gpu: expected cpu or cuda" -- $UST generate $CK --prompt hi --device gpu
expect_exit generate_both_prompts_exit_2 2 "exactly one of --prompt and --prompt-file" -- \
    $UST generate $CK --prompt hi --prompt-file $TMP/prompt.txt --tokenizer bytes
expect_exit generate_no_prompt_exits_2 2 "exactly one of --prompt and --prompt-file" -- $UST generate $CK --tokenizer bytes
expect_exit generate_missing_prompt_file_exits_2 2 "--prompt-file .*nope" -- $UST generate $CK --prompt-file $TMP/nope --tokenizer bytes
expect_exit generate_unknown_option_exits_2 2 "unknown option --beams for generate" -- $UST generate $CK --prompt hi --beams 4
# a checkpoint whose config names a tensor its file lacks: refused, naming the tensor
rm -rf $TMP/moe2 && cp -r $CK/step_6 $TMP/moe2 && sed -i 's/num_experts: 0/num_experts: 4/' $TMP/moe2/state.json &&
    python3 test/tools/reseal.py $TMP/moe2
expect_exit generate_missing_tensor_exits_2 2 "model.layers.0.mlp.router.weight" -- $UST generate $TMP/moe2 --prompt hi --tokenizer bytes
# a Hugging Face directory (the export of the llama and of the Mixtral-shaped checkpoints): the
# same greedy tokens as the checkpoint itself; a directory that is not a model exits 2
for t in llama mixtral; do
    $UST export $TMP/$t/ckpt --to hf $TMP/$t-hf >/dev/null 2>&1
    $UST generate $TMP/$t-hf --prompt "$PROMPT" --tokenizer bytes --temperature 0 --max-new-tokens 16 >$TMP/$t-hf.out 2>$TMP/$t-hf.err &&
        cmp -s $TMP/$t.out $TMP/$t-hf.out && pass generate_${t}_hf_directory_equals_its_checkpoint ||
        fail generate_${t}_hf_directory_equals_its_checkpoint "$(tail -2 $TMP/$t-hf.err)"
done
mkdir -p $TMP/hfdir && echo '{}' >$TMP/hfdir/config.json
expect_exit generate_bad_hf_directory_exits_2 2 "hfdir" -- $UST generate $TMP/hfdir --prompt hi --tokenizer bytes
