#!/usr/bin/env bash
# `ustrain plan`: the ranked table, the three steps, --write's config validates and trains, the
# memory it reports equals `validate`'s plan and the arena peak a real CPU run of the chosen layout
# measures, and bad input exits 2 with a message.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: plan, seed: 7, out_dir: $TMP/run}
model: {arch: llama, n_layer: 4, d_model: 64, n_head: 8, n_kv_head: 4, d_ff: 128, vocab_size: 500, max_seq_len: 64}
train: {steps: 2, seq_len: 32, micro_batch_size: 1, global_batch_size: 8}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {dir: $TMP/run/ckpt, every: 0, resume: none}
EOT
sed -e 's/d_ff: 128,/d_ff: 128, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64},/' $TMP/c.yaml >$TMP/moe.yaml

# plan_and_run NAME CONFIG WORLD PLAN_OPTIONS...: plans, writes the best layout, validates it and
# trains it for 2 steps under scripts/ustrun; the plan's bytes must equal validate's and the
# measured arena peak
plan_and_run() {
    local name=$1 cfg=$2 world=$3; shift 3
    local out planned validated got
    out=$($UST plan $cfg --world $world --write $TMP/$name.yaml "$@" 2>&1) ||
        { fail $name "plan failed: $(echo "$out" | tail -2)"; return; }
    planned=$(echo "$out" | sed -n 's/^  memory per rank: .*(\([0-9]*\) bytes;.*/\1/p')
    validated=$($UST validate $TMP/$name.yaml --world $world | sed -n 's/^  total.*(\([0-9]*\) bytes).*/\1/p')
    [ -n "$planned" ] && [ "$planned" = "$validated" ] ||
        { fail $name "plan says $planned bytes, validate $validated"; return; }
    scripts/ustrun --nproc-per-node $world $UST train $TMP/$name.yaml \
        --set logging.metrics_file=$TMP/$name.jsonl >$TMP/$name.out 2>&1 ||
        { fail $name "training the planned layout failed: $(tail -2 $TMP/$name.out)"; return; }
    # the written config runs the schedule its header names
    local sched=$(sed -n 's/^# written.* pp_schedule=\([a-z0-9]*\) .*/\1/p' $TMP/$name.yaml)
    grep -Eq "^ *pp_schedule: \"?$sched\"?$" $TMP/$name.yaml ||
        { fail $name "header says pp_schedule=$sched: $(grep pp_schedule $TMP/$name.yaml)"; return; }
    got=$(grep -o '"peak_mem_bytes":[0-9]*' $TMP/$name.jsonl | tail -1 | cut -d: -f2)
    [ "$got" = "$planned" ] || { fail $name "measured arena peak $got bytes, plan $planned"; return; }
    pass "$name ($(grep '^# written' $TMP/$name.yaml | sed 's/.*plan: //'))"
}
plan_and_run plan_cli_best_layout_trains_with_the_planned_memory $TMP/c.yaml 4
# two nodes of two GPUs with little memory: a different layout, still the measured peak
plan_and_run plan_cli_two_nodes_tight_memory_trains_with_the_planned_memory $TMP/c.yaml 4 \
    --gpus-per-node 2 --gpu-mem 1.6MiB
plan_and_run plan_cli_moe_layout_trains_with_the_planned_memory $TMP/moe.yaml 4 --gpus-per-node 2

# the table: three steps, ranked by step time (tokens/s, the last column, never increases), every
# row within --gpu-mem, --top rows
out=$($UST plan $TMP/c.yaml --world 8 --top 6 --gpu-mem 2MiB)
rows=$(echo "$out" | grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ')
if echo "$out" | grep -q '^step 1, fit one model instance' && echo "$out" | grep -q '^step 2' &&
    echo "$out" | grep -q '^step 3' && [ "$rows" = 6 ] &&
    echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' | awk '{print $NF}' | sort -g -r -c 2>/dev/null; then
    pass plan_cli_table_ranked_by_step_time
else
    fail plan_cli_table_ranked_by_step_time "rows $rows: $(echo "$out" | head -12)"
fi
# the schedule column: every row names a schedule the search tries, 1f1b whenever pp is 1
if echo "$out" | grep -q '^  #   dp  tp  pp vpp schedule ' &&
    echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' | awk '$6 !~ /^(1f1b|interleaved|zb|dualpipev|dualpipe)$/ || ($4 == 1 && $6 != "1f1b") {bad=1} END {exit bad}'; then
    pass plan_cli_table_names_each_schedule
else
    fail plan_cli_table_names_each_schedule "$(echo "$out" | grep -A3 '^  #')"
fi
# memory column: parse "x.y MiB" / "KiB" and compare with 2 MiB
if echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' | awk '{v=$(NF-2); u=$(NF-1); m=(u=="MiB")?v*1048576:(u=="KiB")?v*1024:v; if (m > 2*1048576) bad=1} END {exit bad}'; then
    pass plan_cli_rows_fit_gpu_mem
else
    fail plan_cli_rows_fit_gpu_mem "$(echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' | head -3)"
fi
n_all=$($UST plan $TMP/c.yaml --world 8 --all --top 100000 | grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ')
n_mesh=$($UST plan $TMP/c.yaml --world 8 --top 100000 | grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ')
[ "$n_all" -gt "$n_mesh" ] && [ "$n_mesh" -gt 1 ] && pass plan_cli_all_lists_every_variant ||
    fail plan_cli_all_lists_every_variant "--all $n_all rows, per mesh $n_mesh"

# the global batch in sequences or tokens, and --seq-len
expect_exit plan_cli_global_batch_tokens 0 '^step 2, reach the global batch: 16 sequences x 32 tokens = 512 tokens' -- \
    $UST plan $TMP/c.yaml --world 4 --global-batch 512tok
expect_exit plan_cli_global_batch_k_suffix 0 '32 sequences x 32 tokens = 1024 tokens' -- \
    $UST plan $TMP/c.yaml --world 4 --global-batch 1K
expect_exit plan_cli_seq_len 0 '16 sequences x 64 tokens' -- \
    $UST plan $TMP/c.yaml --world 4 --global-batch 16 --seq-len 64
expect_exit plan_cli_reports_the_configs_own_layout 0 "the config's own layout: dp=4 tp=1 .* would rank [0-9]+ of" -- \
    $UST plan $TMP/c.yaml --world 4 --set parallel.dp=4
expect_exit plan_cli_help 0 'usage: ustrain plan CONFIG --world N' -- $UST plan --help

# a real size: llama-8b on 64 GPUs, its written config validates at 64 with the same memory
out=$($UST plan configs/llama-8b.yaml --world 64 --gpu-mem 80GiB --gpus-per-node 8 \
    --global-batch 4M --write $TMP/l8.yaml 2>&1)
planned=$(echo "$out" | sed -n 's/^  memory per rank: .*(\([0-9]*\) bytes;.*/\1/p')
validated=$($UST validate $TMP/l8.yaml --world 64 2>&1 | sed -n 's/^  total.*(\([0-9]*\) bytes).*/\1/p')
if echo "$out" | grep -q '512 sequences x 8192 tokens = 4194304 tokens' && [ -n "$planned" ] &&
    [ "$planned" = "$validated" ] && [ "$planned" -le $((80 << 30)) ]; then
    pass plan_cli_llama_8b_64_gpus
else
    fail plan_cli_llama_8b_64_gpus "plan $planned bytes, validate $validated: $(echo "$out" | tail -3)"
fi

# DeepSeek-V3 at its real size (configs/deepseek-v3.yaml) on 2048 GPUs: 671B parameters in ~45k
# expert tensors (a layout's memory plan counts a layer's experts once; about 1 min of CPU at this
# global batch: zb and dualpipe(v) run latent attention and are simulated too, each (schedule, pp,
# vpp, micro-batches, recompute) once per search); pipelines over its 61 layers split them unevenly; the
# config's own layout (pp 16: 3, 4 x 13, 3, 3) fits 80 GiB and is ranked with its traffic; the
# written best validates at 2048 with the memory the plan printed and fits
out=$(timeout -k 5 300 $UST plan configs/deepseek-v3.yaml --world 2048 --gpu-mem 80GiB \
    --global-batch 2048 --top 3 --write $TMP/ds.yaml 2>&1)
planned=$(echo "$out" | sed -n 's/^  memory per rank: .*(\([0-9]*\) bytes;.*/\1/p')
validated=$($UST validate $TMP/ds.yaml --world 2048 2>&1 | sed -n 's/^  total.*(\([0-9]*\) bytes).*/\1/p')
if echo "$out" | grep -q '^model: llama, 671 B parameters (37.6 B active per token), 61 layers' &&
    echo "$out" | grep -q "the config's own layout: dp=128 tp=1 pp=16 .* 32.8 GiB per rank; would rank" &&
    echo "$out" | grep -q 'ep .* (64 ranks, inter-node, .* sent, .* of them across nodes)' && [ -n "$planned" ] &&
    [ "$planned" = "$validated" ] && [ "$planned" -le $((80 << 30)) ]; then
    pass plan_cli_deepseek_v3_2048_gpus
else
    fail plan_cli_deepseek_v3_2048_gpus "plan $planned bytes, validate $validated: $(echo "$out" | tail -4)"
fi

# bad input: exit 2 with the offending value
P="$UST plan $TMP/c.yaml"
expect_exit plan_cli_unknown_option 2 'unknown option --frobnicate' -- $P --world 4 --frobnicate 1
expect_exit plan_cli_missing_world 2 'missing --world' -- $P
expect_exit plan_cli_world_not_a_number 2 '--world abc' -- $P --world abc
expect_exit plan_cli_world_zero 2 '--world 0' -- $P --world 0
expect_exit plan_cli_world_without_layout 2 'no valid layout of --world 7' -- $P --world 7
expect_exit plan_cli_bad_gpu_mem 2 '--gpu-mem 80XB' -- $P --world 4 --gpu-mem 80XB
expect_exit plan_cli_nothing_fits 2 'none of the .* valid layouts fits --gpu-mem 1.0 KiB' -- $P --world 4 --gpu-mem 1KiB
expect_exit plan_cli_bad_global_batch 2 '--global-batch 4Q' -- $P --world 4 --global-batch 4Q
expect_exit plan_cli_tokens_not_whole_sequences 2 'not a whole number of 32-token sequences' -- $P --world 4 --global-batch 100tok
expect_exit plan_cli_bad_mfu 2 '--mfu 1.5' -- $P --world 4 --mfu 1.5
expect_exit plan_cli_bad_bandwidth 2 '--bw-inter -5' -- $P --world 4 --bw-inter -5
expect_exit plan_cli_missing_value 2 '--top needs a value' -- $P --world 4 --top
expect_exit plan_cli_seq_len_over_max 2 'train.seq_len \(128\) must be <= model.max_seq_len \(64\)' -- $P --world 4 --seq-len 128
expect_exit plan_cli_missing_config 2 'nope.yaml' -- $UST plan $TMP/nope.yaml --world 4
expect_exit plan_cli_bad_set 2 'model.n_layr' -- $P --world 4 --set model.n_layr=3
# --write's file is checked before the search: a FIFO would hang its end, a missing directory lose it
mkfifo $TMP/plan.fifo
expect_exit plan_cli_write_to_a_fifo 2 '--write .*plan.fifo: a FIFO, not a regular file' -- timeout -k 5 60 $P --world 4 --write $TMP/plan.fifo
expect_exit plan_cli_write_into_a_missing_directory 2 '--write .*/nodir/x.yaml: no file can be created in its directory \(No such file' -- $P --world 4 --write $TMP/nodir/x.yaml
# ... and it is claimed through a temporary created before the search: a read-only file system is
# exit 2 up front (root passes access() checks, so only a real creation tells), and a search that
# fails leaves an existing file as it was, with no temporary beside it
mkdir -p $TMP/ro
if mount -t tmpfs -o ro,size=64k none $TMP/ro 2>/dev/null; then
    expect_exit plan_cli_write_on_a_read_only_fs 2 '--write .*/ro/x.yaml: .*Read-only file system' -- $P --world 4 --write $TMP/ro/x.yaml
    umount $TMP/ro
else
    echo "SKIP plan_cli_write_on_a_read_only_fs: no tmpfs mount here (an unprivileged run)"
fi
echo "keep me" >$TMP/kept.yaml
expect_exit plan_cli_failed_search_keeps_the_file 2 'none of the .* valid layouts fits' -- $P --world 4 --gpu-mem 1 --write $TMP/kept.yaml
[ "$(cat $TMP/kept.yaml)" = "keep me" ] && [ -z "$(ls -A $TMP | grep '\.kept\.yaml\.plan\.')" ] &&
    pass plan_cli_failed_search_leaves_no_temporary || fail plan_cli_failed_search_leaves_no_temporary "$(cat $TMP/kept.yaml; ls -A $TMP)"
