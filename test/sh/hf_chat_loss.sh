#!/usr/bin/env bash
# The masked loss against transformers: a tiny Qwen2 made by transformers is imported, a chat set
# is prepared with the ChatML template (assistant tokens the targets), and ustrain's first-step
# loss over a global batch of 4 windows (2 micro-batches; and under dp=2 and pp=2) equals
# transformers' loss with labels -100 on the positions the mask leaves out, within 1e-5
# relative (fp32 both sides; measured: see the PASS line's figures).
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/chat_reference.py"
need_py hf_chat_loss_needs_torch torch transformers tokenizers || exit 0
$REF make $TMP/t >/dev/null 2>&1 && $REF model $TMP/qwen 640 >$TMP/model.log 2>&1 ||
    { fail hf_chat_loss_setup "$(tail -2 $TMP/model.log)"; exit 0; }
$UST data prep --tokenizer $TMP/t/chatml/tokenizer.json --chat chatml --val-fraction 0 --out $TMP/sft \
    $TMP/t/convs.jsonl >$TMP/prep.log 2>&1 || { fail hf_chat_loss_prep "$(tail -2 $TMP/prep.log)"; exit 0; }
cat >$TMP/run.yaml <<EOT
run:   {name: hf-chat, seed: 7}
model: {arch: auto, init_from: $TMP/qwen}
train: {steps: 1, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
data:  {train: "$TMP/sft/train_*.bin", val: null}
EOT
want=$($REF loss $TMP/qwen $TMP/sft/train_000.bin 32 4 2>$TMP/ref.log) || { fail hf_chat_loss_reference "$(tail -2 $TMP/ref.log)"; exit 0; }
for layout in "1" "2 parallel.dp=2" "2 parallel.pp=2"; do
    n=${layout%% *} sets=""; [ "$n" = 1 ] || sets="--set ${layout#* }"
    tag=$(echo "$layout" | tr ' =.' '___')
    scripts/ustrun --nproc-per-node $n $UST train $TMP/run.yaml --set checkpoint.dir=$TMP/ck$tag \
        --set logging.metrics_file=$TMP/m$tag.jsonl $sets >$TMP/train$tag.log 2>&1 ||
        { fail hf_chat_masked_loss_equals_transformers_$tag "$(tail -2 $TMP/train$tag.log)"; continue; }
    got=$(python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(r['loss'], r['target_tokens'])" $TMP/m$tag.jsonl)
    python3 - "$got" "$want" <<'EOT' && pass hf_chat_masked_loss_equals_transformers_$tag || fail hf_chat_masked_loss_equals_transformers_$tag "ustrain '$got' transformers '$want'"
import sys
(a, na), (b, nb) = (map(float, s.split()) for s in sys.argv[1:3])
print(f"  ustrain {a:.8f} over {na:.0f} targets, transformers {b:.8f} over {nb:.0f}: rel {abs(a - b) / b:.2e}")
assert na == nb and abs(a - b) <= 1e-5 * abs(b)
EOT
done
exit 0
