#!/usr/bin/env bash
# `ustrain data prep` inputs: gzip and zstd (recognised by content, concatenated members too) give
# the tokens of their plain text; damaged or cut-short streams and binary input exit 2 naming the
# file (binary is tokenized with --binary-ok); JSON lines are recognised by content (.json from
# HF's to_json); standard input ("-") reads a pipe, and scripts/parquet-text.py streams Parquet
# into it (where pyarrow can be installed); --val-fraction 0 writes no val shards.
. "$(dirname "$0")/../lib.sh"

P="$UST data prep --threads 1"
python3 - $TMP <<'EOT'
import json, random, sys
d = sys.argv[1]
random.seed(5)
text = "".join(random.choice("abcdefgh ijklmnop\n\u00e9\u4e2d") for _ in range(200000))
open(f"{d}/big.txt", "w").write(text)
with open(f"{d}/docs.json", "w") as f:   # JSON lines under a .json name
    for i in range(300):
        f.write(json.dumps({"text": f"document {i}: " + text[i * 50:(i + 1) * 50]}) + "\n")
with open(f"{d}/docs.jsonl", "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": f"document {i}: " + text[i * 50:(i + 1) * 50]}) + "\n")
open(f"{d}/bin.dat", "wb").write(bytes(range(256)) * 50)
EOT
gzip -k $TMP/big.txt && zstd -q -k $TMP/big.txt && zstd -q -k $TMP/docs.json
cat $TMP/big.txt $TMP/big.txt >$TMP/big2.txt && cat $TMP/big.txt.gz $TMP/big.txt.gz >$TMP/big2.txt.gz
# same_tokens TAG REF_INPUT INPUT...: both give byte-identical shards
same_tokens() {
    local tag=$1 ref=$2; shift 2
    rm -rf $TMP/a $TMP/b
    if $P --out $TMP/a $ref >$TMP/a.log 2>&1 && $P --out $TMP/b "$@" >$TMP/b.log 2>&1 &&
        cmp -s $TMP/a/train_000.bin $TMP/b/train_000.bin && cmp -s $TMP/a/val_000.bin $TMP/b/val_000.bin; then
        pass $tag
    else
        fail $tag "$(tail -1 $TMP/a.log) / $(tail -1 $TMP/b.log)"
    fi
}
same_tokens prep_gzip_equals_plain $TMP/big.txt $TMP/big.txt.gz
same_tokens prep_zstd_equals_plain $TMP/big.txt $TMP/big.txt.zst
same_tokens prep_gzip_members_concatenated $TMP/big2.txt $TMP/big2.txt.gz
same_tokens prep_json_lines_by_content $TMP/docs.jsonl $TMP/docs.json
same_tokens prep_compressed_json_lines $TMP/docs.jsonl $TMP/docs.json.zst
same_tokens prep_stdin_pipe $TMP/big.txt - <$TMP/big.txt
$P --out $TMP/c $TMP/docs.json | grep -q "^data prep: 300 documents" && pass prep_json_file_is_300_documents ||
    fail prep_json_file_is_300_documents "$($P --out $TMP/c2 $TMP/docs.json | head -1)"

head -c 40000 $TMP/big.txt.gz >$TMP/cut.gz
head -c 40000 $TMP/big.txt.zst >$TMP/cut.zst
expect_exit prep_cut_gzip_exits_2 2 "cut.gz: the gzip stream is cut short" -- $P --out $TMP/x $TMP/cut.gz
expect_exit prep_cut_zstd_exits_2 2 "cut.zst: the zstd stream is cut short" -- $P --out $TMP/x $TMP/cut.zst
python3 -c "
import sys; b = bytearray(open('$TMP/big.txt.gz', 'rb').read()); b[5000] ^= 0xff
open('$TMP/bad.gz', 'wb').write(b)"
expect_exit prep_damaged_gzip_exits_2 2 "bad.gz: " -- $P --out $TMP/x $TMP/bad.gz
expect_exit prep_binary_refused 2 "bin.dat: binary input \(a NUL byte at offset 0.*--binary-ok" -- \
    $P --out $TMP/x $TMP/bin.dat
[ ! -e $TMP/x/train_000.bin ] && pass prep_refused_input_writes_no_shards || fail prep_refused_input_writes_no_shards "$(ls $TMP/x)"
expect_exit prep_binary_ok_tokenizes_it 0 "^data prep: 1 documents, 0.0 MB -> 12801 tokens" -- \
    $P --out $TMP/y --binary-ok $TMP/bin.dat
expect_exit prep_stdin_twice_exits_2 2 'standard input\) twice' -- $P --out $TMP/x - -
expect_exit prep_val_fraction_0_no_val 0 "val: 0 tokens in 0 shards" -- $P --out $TMP/z --val-fraction 0 $TMP/big.txt
expect_exit prep_one_thread_grammar 0 "1 thread\)" -- $P --out $TMP/z2 $TMP/big.txt

# validate checks the shards' meta.json against the model without reading a token
$P --out $TMP/v $TMP/big.txt >/dev/null 2>&1
expect_exit validate_refuses_a_vocabulary_above_the_model 2 "$TMP/v/meta.json: the shards' tokens come from a vocabulary of 257, above model.vocab_size = 200" -- \
    $UST validate configs/tiny.yaml --set "data.train=$TMP/v/train_*.bin" --set model.vocab_size=200
expect_exit validate_accepts_a_vocabulary_that_fits 0 "valid" -- \
    $UST validate configs/tiny.yaml --set "data.train=$TMP/v/train_*.bin" --set "data.val=$TMP/v/val_*.bin" --set model.vocab_size=300
echo '{"vocab_size": "many"}' >$TMP/v/meta.json
expect_exit validate_refuses_a_malformed_meta_json 2 "$TMP/v/meta.json: not a data prep meta.json" -- \
    $UST validate configs/tiny.yaml --set "data.train=$TMP/v/train_*.bin" --set model.vocab_size=300
# a meta.json at odds with itself: its end of text outside its own vocabulary (issue 33 item 8)
echo '{"tokenizer": "bytes", "eot_id": 300, "vocab_size": 100, "token_bytes": 2, "format": "llmc"}' >$TMP/v/meta.json
expect_exit validate_refuses_a_meta_json_eot_beyond_its_vocabulary 2 "$TMP/v/meta.json: eot_id 300 is not a token of its own vocab_size 100" -- \
    $UST validate configs/tiny.yaml --set "data.train=$TMP/v/train_*.bin" --set model.vocab_size=512
expect_exit train_refuses_a_meta_json_eot_beyond_its_vocabulary 2 "$TMP/v/meta.json: eot_id 300 is not a token of its own vocab_size 100" -- \
    $UST train configs/tiny.yaml --set "data.train=$TMP/v/train_*.bin" --set data.val=null --set model.vocab_size=512 \
    --set checkpoint.dir=$TMP/v/ck --set logging.metrics_file=$TMP/v/m.jsonl --set train.steps=1

# The output directory: shards are written under temporary names and renamed, so a FIFO or a
# symlink planted at a shard's name is replaced (never opened, never followed), a failed run
# leaves the earlier shards as they were, and a second prep into a directory being written is
# refused.
rm -rf $TMP/o && $P --out $TMP/o $TMP/docs.jsonl >/dev/null 2>&1
sha256sum $TMP/o/*.bin >$TMP/o.sums
rm -rf $TMP/plant && mkdir -p $TMP/plant && mkfifo $TMP/plant/train_000.bin &&
    echo precious >$TMP/victim && ln -s $TMP/victim $TMP/plant/val_000.bin
out=$(timeout -k 5 60 $P --out $TMP/plant $TMP/docs.jsonl 2>&1); rc=$?
if [ $rc = 0 ] && [ -f $TMP/plant/train_000.bin ] && [ ! -L $TMP/plant/val_000.bin ] &&
   [ "$(cat $TMP/victim)" = precious ] && cmp -s $TMP/plant/train_000.bin $TMP/o/train_000.bin; then
    pass prep_replaces_a_planted_fifo_and_symlink
else fail prep_replaces_a_planted_fifo_and_symlink "exit $rc: $(echo "$out" | tail -1); victim: $(cat $TMP/victim | head -c 40)"; fi
out=$( (ulimit -f 200; $P --out $TMP/o $TMP/big2.txt) 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q "write failed: File too large" && sha256sum -c --quiet $TMP/o.sums &&
   [ -z "$(ls -A $TMP/o | grep -v -e '^meta.json$' -e '^train_000.bin$' -e '^val_000.bin$')" ]; then
    pass prep_failing_to_write_exits_1_and_keeps_the_earlier_shards
else fail prep_failing_to_write_exits_1_and_keeps_the_earlier_shards "exit $rc: $(echo "$out" | tail -1); $(ls -A $TMP/o | tr '\n' ' ')"; fi
hold_lock $TMP/o
expect_exit prep_into_a_directory_being_written_exits_2 2 "--out .*/o is being written by another process" -- \
    $P --out $TMP/o $TMP/big.txt
release_lock
sha256sum -c --quiet $TMP/o.sums && pass prep_refused_leaves_the_shards || fail prep_refused_leaves_the_shards "changed"
expect_exit prep_refuses_a_hundred_thousand_shards 2 "--shard-tokens 1 cuts .* into .* files, more than 100000" -- \
    $P --out $TMP/o --shard-tokens 1 $TMP/big.txt
rm -rf $TMP/demo && mkdir -p $TMP/demo && mkfifo $TMP/demo/train_000.bin && ln -s $TMP/victim $TMP/demo/val_000.bin
out=$(timeout -k 5 60 $UST data demo $TMP/demo 2>&1); rc=$?
if [ $rc = 0 ] && [ -f $TMP/demo/train_000.bin ] && [ ! -L $TMP/demo/val_000.bin ] && [ "$(cat $TMP/victim)" = precious ]; then
    pass data_demo_replaces_a_planted_fifo_and_symlink
else fail data_demo_replaces_a_planted_fifo_and_symlink "exit $rc: $(echo "$out" | tail -1)"; fi

# An escaped NUL in a JSON text is a byte of the text, not its end ("abc\u0000def": 7 bytes and the
# end of text); the field is found past nested objects holding the same key.
printf '%s\n' '{"text": "abc\u0000def"}' '{"meta": {"text": "x", "q": "\"}"}, "text": "caf\u00e9 \ud83d\ude00"}' >$TMP/nul.jsonl
rm -rf $TMP/nul && out=$($P --val-fraction 0 --out $TMP/nul $TMP/nul.jsonl 2>&1)
if [ "$(python3 -c "import json; print(json.load(open('$TMP/nul/meta.json'))['train_tokens'])" 2>/dev/null)" = 19 ]; then
    pass prep_json_escaped_nul_kept
else fail prep_json_escaped_nul_kept "$(echo "$out" | head -1)"; fi

# A line too long for the memory (600 MB under 1.2 GB of address space: getline's buffer grows to
# 1 GiB): getline's ENOMEM is a failure naming the file (exit 1), never the end of the file (which
# dropped that line and the rest and exited 0).
printf '%s\n' '{"text": "a b"}' >$TMP/small.jsonl
if (ulimit -v 1200000; $P --out $TMP/probe $TMP/small.jsonl) >/dev/null 2>&1; then
    python3 -c "
import sys
with open(sys.argv[1], 'w') as f:
    f.write('{\"text\": \"first\"}\n{\"text\": \"' + 'x' * (600 << 20) + '\"}\n{\"text\": \"last\"}\n')" $TMP/long.jsonl
    expect_exit prep_getline_enomem_is_a_failure 1 "long.jsonl: read failed at line 2: Cannot allocate memory" -- \
        bash -c "ulimit -v 1200000; exec $P --out $TMP/long $TMP/long.jsonl"
    rm -f $TMP/long.jsonl
else
    pass "prep_getline_enomem_is_a_failure (skipped: the binary needs more than 1.2 GB of address space)"
fi

# Parquet through pyarrow: rows stream into data prep's standard input
if need_py prep_parquet_through_stdin pyarrow; then
    python3 - $TMP <<'EOT'
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
texts = [json.loads(l)["text"] for l in open(f"{d}/docs.jsonl")]
pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), f"{d}/docs.parquet", row_group_size=64)
EOT
    python3 scripts/parquet-text.py $TMP/docs.parquet >$TMP/pq.jsonl
    same_tokens prep_parquet_through_stdin $TMP/docs.jsonl - <$TMP/pq.jsonl
    # given directly, a Parquet file is recognised by its magic and the converter named
    expect_exit prep_parquet_direct 2 "parquet-text.py" -- $P --out $TMP/pqd $TMP/docs.parquet
    expect_exit parquet_missing_column 1 "no column 'body'" -- python3 scripts/parquet-text.py --column body $TMP/docs.parquet
fi
exit 0
