#!/usr/bin/env bash
# Bad input gets a clear message and exit 2 before any heavy work: sizes that would overflow or
# cannot fit the machine, thread counts, every numeric option of every sub-command, YAML list
# items, deep or huge YAML, empty configs; and every sub-command answers --help with its usage
# and exit 0.
. "$(dirname "$0")/../lib.sh"

D=$TMP/data
$UST data demo "$D" >/dev/null || { fail demo_data "ustrain data demo failed"; exit 1; }
C=$TMP/c.yaml
sed -e "s#data/tiny/#$D/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$C
V="$UST validate $C"

# --- item 4: sizes in 64 bits, limits per key, derived sizes, the machine's memory
expect_exit n_layer_limit 2 'model.n_layer: 2147483647 is out of range \(must be in 1\.\.4096\)' -- \
    $V --set model.n_layer=2147483647
expect_exit vocab_pad_limit 2 'model.vocab_pad: 2147483647 is out of range \(must be in 1\.\.65536\)' -- \
    $V --set model.vocab_pad=2147483647
expect_exit vocab_size_limit 2 'model.vocab_size: 2147483647 is out of range \(must be in 1\.\.16777216\)' -- \
    $V --set model.vocab_size=2147483647
expect_exit global_batch_limit 2 'train.global_batch_size: 2147483647 is out of range \(must be in 1\.\.1073741824\)' -- \
    $V --set train.global_batch_size=2147483647
expect_exit tokens_per_micro_batch_limit 2 'train.micro_batch_size x train.seq_len = 16777216 x 128 = 2147483648 tokens per micro-batch; at most 16777216' -- \
    $V --set train.micro_batch_size=16777216 --set train.global_batch_size=16777216
expect_exit parameter_count_limit 2 'the model would have about .* parameters \(model.n_layer 4096, d_model 1048576.*at most 2\^42' -- \
    $V --set model.n_layer=4096 --set model.d_model=1048576
# 2^41 parameters: 32 TiB of weights, gradients and AdamW state, more than any machine's RAM
HUGE="--set model.vocab_size=16777216 --set model.d_model=65536 --set model.n_head=512 --set model.n_kv_head=512"
expect_exit cpu_plan_over_ram_refused_by_validate 2 'the memory plan needs [0-9.]+ TiB \([0-9]+ bytes\) for the 1 rank of this layout on run.device cpu .* but this machine has .* of physical memory' -- \
    $V $HUGE
expect_exit cpu_plan_of_all_ranks_over_ram 2 'memory plan needs .* for the 1048576 ranks of this layout on run.device cpu \(up to .* each\)' -- \
    $V --set parallel.dp=1048576 --set train.global_batch_size=4194304 --world 1048576
expect_exit cuda_plan_over_1tib_refused 2 'the memory plan needs .* on the busiest rank; no GPU has more than 1.0 TiB' -- \
    $V $HUGE --set run.device=cuda
out=$($UST train $C $HUGE --set checkpoint.every=0 2>&1); rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q 'physical memory' && [ ! -e $TMP/run ]; then
    pass train_refuses_a_plan_over_ram_before_allocating
else
    fail train_refuses_a_plan_over_ram_before_allocating "exit $rc, $TMP/run $([ -e $TMP/run ] && echo exists || echo absent): $(echo "$out" | tail -2)"
fi
expect_exit bench_train_refuses_a_plan_over_ram 2 'physical memory' -- $UST bench train $C $HUGE
# the planner still explores big layouts against --gpu-mem, not this machine
expect_exit plan_of_llama_8b_still_works 0 'best: dp=' -- $UST plan configs/llama-8b.yaml --world 64 --gpu-mem 80GiB

# --- item 8: threads
cpus=$(getconf _NPROCESSORS_ONLN); lim=$((4 * cpus < 1024 ? 4 * cpus : 1024))
expect_exit threads_table_limit 2 'train.threads: 100000 is out of range \(must be in 0\.\.1024\)' -- \
    $V --set train.threads=100000
if [ $lim -lt 1024 ]; then
    expect_exit threads_over_4x_cpus_refused_by_train 2 "train.threads \($((lim + 1))\) must be at most $lim \(4 x the $cpus online CPUs" -- \
        $UST train $C --set train.threads=$((lim + 1)) --set checkpoint.every=0
fi

# --- item 11: every numeric option, strictly
for w in abc 0 -1 2147483648 4x ' 4' 1e3; do
    expect_exit "validate_world_${w// /_}" 2 "--world $w: expected 1\.\.16777216 \(a whole number\)" -- $V --world "$w"
done
expect_exit train_takes_no_world 2 'unknown option --world for train' -- $UST train $C --world 1
expect_exit bench_steps_abc 2 '--steps abc: expected 1\.\.1000000' -- $UST bench train $C --steps abc
expect_exit bench_steps_zero 2 '--steps 0: expected 1\.\.1000000' -- $UST bench train $C --steps 0
expect_exit bench_steps_wrapping 2 '--steps 4294967297: expected' -- $UST bench train $C --steps 4294967297
P="$UST data prep --out $TMP/prep $D/train_000.bin"
expect_exit prep_threads_suffix 2 '--threads 1x: expected 1\.\.256' -- $P --threads 1x
expect_exit prep_val_fraction_nan 2 '--val-fraction nan: expected a number below 1' -- $P --val-fraction nan
expect_exit prep_val_fraction_one 2 '--val-fraction 1: expected a number below 1' -- $P --val-fraction 1
expect_exit prep_shard_tokens_wrapping 2 '--shard-tokens 99999999999: expected 1\.\.2147483647' -- $P --shard-tokens 99999999999
expect_exit prep_eot_negative 2 '--eot -1: expected 0\.\.2147483646' -- $P --eot -1
expect_exit prep_chunk_bytes_small 2 '--chunk-bytes 8: expected 16\.\.' -- $P --chunk-bytes 8
B="$UST bench comm"
expect_exit comm_min_bytes_abc 2 '--min-bytes abc: expected a size from 4 to 68719476736 bytes' -- $B --min-bytes abc
expect_exit comm_max_bytes_huge 2 '--max-bytes 1e30: expected a size' -- $B --max-bytes 1e30
expect_exit comm_max_bytes_negative 2 '--max-bytes -4K: expected a size' -- $B --max-bytes -4K
expect_exit comm_iters_zero 2 '--iters 0: expected 1\.\.1000000' -- $B --iters 0
expect_exit comm_timeout_nan 2 '--timeout nan: expected a number in \(0, 86400\]' -- $B --timeout nan
expect_exit comm_timeout_suffix 2 '--timeout 10s: expected a number' -- $B --timeout 10s
PL="$UST plan $C"
expect_exit plan_world_wrapping 2 '--world 2147483648: expected 1\.\.16777216' -- $PL --world 2147483648
expect_exit plan_top_negative 2 '--top -3: expected 1\.\.16777216' -- $PL --world 1 --top -3
expect_exit plan_gpus_per_node_fraction 2 '--gpus-per-node 1.5: expected 1\.\.16777216' -- $PL --world 1 --gpus-per-node 1.5
expect_exit plan_gpu_mem_zero 2 '--gpu-mem 0: expected a size from 1 to' -- $PL --world 1 --gpu-mem 0
expect_exit plan_gpu_mem_nan 2 '--gpu-mem nanGiB: expected a size' -- $PL --world 1 --gpu-mem nanGiB
expect_exit plan_mfu_nan 2 '--mfu nan: expected a number in \(0, 1\]' -- $PL --world 1 --mfu nan
expect_exit plan_peak_flops_inf 2 '--peak-flops inf: expected a number > 0' -- $PL --world 1 --peak-flops inf
expect_exit plan_bw_hex 2 '--bw-intra 0x10: expected a number > 0' -- $PL --world 1 --bw-intra 0x10
expect_exit plan_global_batch_wrapping 2 '--global-batch 99999999999999999999: expected sequences' -- $PL --world 1 --global-batch 99999999999999999999
expect_exit plan_global_batch_tokens_overflow 2 '--global-batch 9999999999999G: expected sequences' -- $PL --world 1 --global-batch 9999999999999G

# --- item 12: YAML list items range-checked where they stand
printf 'parallel: {pp: 2, pp_layers: [4294967297, 3]}\n' >$TMP/ppl.yaml
expect_exit pp_layers_item_wrapping 2 'ppl.yaml:1:31: parallel.pp_layers: item 4294967297 is out of range \(must be in 1\.\.4096\)' -- \
    $UST validate $TMP/ppl.yaml
expect_exit pp_layers_set_item_wrapping 2 'parallel.pp_layers: item 4294967297 is out of range' -- \
    $V --set parallel.pp=2 --set parallel.pp_layers=4294967297,3

# --- item 10: deep or huge YAML, refused with file:line:col (the time is printed, not asserted)
python3 - "$TMP" <<'EOF'
import sys
t, n = sys.argv[1], 100000
open(t + '/deep_flow_seq.yaml', 'w').write('train: ' + '[' * n + ']' * n + '\n')
open(t + '/deep_flow_map.yaml', 'w').write('train: ' + '{a: ' * n + '1' + '}' * n + '\n')
open(t + '/deep_block_seq.yaml', 'w').write('- ' * n + '1\n')
open(t + '/deep_block_map.yaml', 'w').write(''.join(' ' * i + 'k%d:\n' % i for i in range(100)) + ' ' * 100 + 'x: 1\n')
open(t + '/big.yaml', 'w').write('#' * 63 + '\n' + ('#' * 63 + '\n') * (1 << 18) + 'train: {steps: 1}\n')
EOF
deep() { # deep NAME POSITION: validate refuses $TMP/NAME.yaml at POSITION
    local t0=$(date +%s.%N)
    expect_exit "$1_refused" 2 "$1.yaml:$2: lists and mappings nested deeper than 64 levels" -- $UST validate $TMP/$1.yaml
    echo "# $1: rejected in $(echo "$(date +%s.%N) - $t0" | bc) s"
}
deep deep_flow_seq 1:71
deep deep_flow_map 1:260
deep deep_block_seq 1:129
deep deep_block_map 65:65
expect_exit config_over_16_mib_refused 2 'big.yaml:262145:1: config is larger than 16 MiB \(the limit\)' -- $UST validate $TMP/big.yaml

# --- item 16: empty configs, for everything that reads one
: >$TMP/empty0.yaml
printf '# nothing but a comment\n\n   \n' >$TMP/empty1.yaml
printf '~\n' >$TMP/empty2.yaml
for f in empty0 empty1 empty2; do
    expect_exit "train_$f" 2 "$f.yaml: config file is empty" -- $UST train $TMP/$f.yaml
    expect_exit "validate_$f" 2 "$f.yaml: config file is empty" -- $UST validate $TMP/$f.yaml
    expect_exit "bench_train_$f" 2 "$f.yaml: config file is empty" -- $UST bench train $TMP/$f.yaml
    expect_exit "plan_$f" 2 "$f.yaml: config file is empty" -- $UST plan $TMP/$f.yaml --world 1
done

# --- item 17: --help and -h for every sub-command, anywhere in its arguments, exit 0
help() { # help NAME PATTERN SUBCOMMAND...
    local name=$1 pat=$2; shift 2
    expect_exit "help_$name" 0 "$pat" -- $UST "$@" --help
    expect_exit "help_h_$name" 0 "$pat" -- $UST "$@" -h
}
help train '^usage: ustrain train CONFIG' train
help validate '^usage: ustrain validate CONFIG' validate
help data '^usage: ustrain data demo DIR' data
help data_demo '^usage: ustrain data demo DIR' data demo
help data_prep '^usage: ustrain data prep --out DIR' data prep
help bench '^usage: ustrain bench train' bench
help bench_train '^usage: ustrain bench train CONFIG' bench train
help bench_comm '^usage: ustrain bench comm' bench comm
help export '^usage: ustrain export CKPT --to hf OUT' export
help plan '^usage: ustrain plan CONFIG --world N' plan
help generate '^usage: ustrain generate CKPT' generate
help bench_generate '^usage: ustrain bench generate CONFIG' bench generate
expect_exit help_after_other_arguments 0 '^usage: ustrain train CONFIG' -- $UST train $C --set train.steps=1 --help
expect_exit help_after_a_bad_value 0 '^usage: ustrain validate' -- $UST validate $C --world abc -h
expect_exit help_of_prep_after_options 0 '^usage: ustrain data prep' -- $UST data prep --out $TMP/x --help
[ ! -e $TMP/x ] && [ ! -e ./--help ] && pass help_does_no_work || fail help_does_no_work "--help wrote something"
out=$($UST export --help)
echo "$out" | grep -q 'step_50)' && ! echo "$out" | grep -q 'step_0000' && pass export_usage_names_real_step_dirs ||
    fail export_usage_names_real_step_dirs "$out"
expect_exit data_demo_refuses_options 2 'data demo takes no options' -- $UST data demo --frobnicate

# --- walkthrough item 8: the small things a new user meets
expect_exit misspelt_command_suggests_the_nearest 2 "unknown command 'trian' \(did you mean 'train'\?\)" -- $UST trian $C
expect_exit misspelt_bench_suggests_the_nearest 2 "unknown bench 'trian' \(did you mean 'bench train'\?\)" -- $UST bench trian $C
expect_exit misspelt_data_suggests_the_nearest 2 "unknown data 'prpe' \(did you mean 'data prep'\?\)" -- $UST data prpe
expect_exit misspelt_far_command_has_no_suggestion 2 "unknown command 'xyzzy'$" -- $UST xyzzy
expect_exit set_with_a_space_suggests_key_eq_value 2 'did you mean --set train.steps=5\?' -- $V --set train.steps 5
expect_exit plan_set_with_a_space_suggests_key_eq_value 2 'did you mean --set train.steps=5\?' -- \
    $UST plan $C --world 2 --set train.steps 5
expect_exit bench_generate_set_with_a_space_suggests_key_eq_value 2 'did you mean --set train.steps=5\?' -- \
    $UST bench generate $C --set train.steps 5
expect_exit eval_set_with_a_space_suggests_key_eq_value 2 'did you mean --set train.steps=5\?' -- \
    $UST eval $TMP/no_ckpt --data "$D/val_*.bin" --set train.steps 5
$UST --help | grep -q '^  bench comm ' && pass help_lists_bench_comm || fail help_lists_bench_comm "$($UST --help | grep bench)"
# standard input has no size to stat: the bytes are counted as they are read
head -c 20000 $D/train_000.bin | od -An -c | head -c 100000 >$TMP/stdin.txt
out=$($UST data prep --out $TMP/prep_stdin - <$TMP/stdin.txt 2>&1)
echo "$out" | grep -q ' 0\.1 MB' && pass data_prep_stdin_counts_the_bytes_read || fail data_prep_stdin_counts_the_bytes_read "$out"
# the parameter count without and with the vocabulary's padding rows (300 -> 384, untied: 2 x 84 x 128)
$V --set model.vocab_size=300 2>&1 | grep -q '(885888 in the model: 864384, and 21504 of vocabulary padding)' &&
    pass parameter_count_separates_vocabulary_padding || fail parameter_count_separates_vocabulary_padding "$($V --set model.vocab_size=300 2>&1 | grep parameters)"
# a finished run run again says so, exits 0, and trains nothing
$UST train $C --set train.steps=2 --set checkpoint.every=2 >/dev/null 2>&1
expect_exit finished_run_says_run_complete 0 '^run complete: step 2 of 2' -- $UST train $C --set train.steps=2 --set checkpoint.every=2
