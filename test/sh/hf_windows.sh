#!/usr/bin/env bash
# Sliding-window attention (model.sliding_window) as test/sh/hf_families.sh checks a family
# (helpers: test/hf_lib.sh): MistralForCausalLM (a window of 8 on every layer) and Qwen2 with
# use_sliding_window (a window of 8 from max_window_layers = 1 on), in sequences of 32, so the
# window matters. Numpy-made directories import and export bit-identically with their config;
# the imports train the one-process losses under tp+sp, cp (ring zigzag and contiguous,
# allgather, Ulysses; with and without document masks), pp (zb) and ZeRO-3; against
# transformers' own models the loss, greedy generate and the exports after 10 steps under
# dp=2 x tp=2 and pp=2 agree; bad windows exit 2 where they stand in the file.
. "$(dirname "$0")/../lib.sh"
need_py hf_windows_python_deps numpy || exit 0
. "$(dirname "$0")/../hf_lib.sh"

# ------------------------------------------------------------------ sliding windows
roundtrip mistral_f32 mistral
roundtrip qwen2_window_bf16 qwen2_window --dtype bf16 --shards 2
python3 - $TMP <<'EOF'
import json, sys
t = sys.argv[1]
for tag, keys in [("mistral_f32", ["architectures", "sliding_window"]),
                  ("qwen2_window_bf16", ["architectures", "use_sliding_window", "sliding_window",
                                         "max_window_layers"])]:
    a = json.load(open(f"{t}/{tag}/config.json"))
    b = json.load(open(f"{t}/{tag}-out/config.json"))
    bad = [k for k in keys if a.get(k) != b.get(k)]
    print(f"PASS {tag}_config_round_trips" if not bad else
          f"FAIL {tag}_config_round_trips: {[(k, a.get(k), b.get(k)) for k in bad]}")
EOF
expect_exit mistral_validate_says_window 0 "attention: sliding window of 8 keys on 2 of 2 layers" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/mistral_f32
expect_exit qwen2_window_validate_says_window 0 "attention: sliding window of 8 keys on 1 of 2 layers" -- \
    $UST validate $TMP/run.yaml --set model.init_from=$TMP/qwen2_window_bf16
# a window of 8 in a sequence of 32, split over ranks: every cp variant masks by global positions
$EQ --name _hf_mistral --set model.init_from=$TMP/mistral_f32 --layout "tp=2 sp=true" \
    --layout "cp=2" --layout "cp=4 parallel.cp_layout=contiguous" --layout "cp=2 parallel.cp_comm=allgather" \
    --layout "cp=2 parallel.cp_comm=a2a" --layout "pp=2 sched=zb" --layout "dp=2 zero=3"
$EQ --name _hf_mistral_docs --set model.init_from=$TMP/mistral_f32 --set data.doc_mask=true \
    --layout "cp=2" --layout "cp=2 parallel.cp_comm=a2a"
$EQ --name _hf_qwen2_window --set model.init_from=$TMP/qwen2_window_bf16 --layout "cp=2" --layout "tp=2 pp=2"
if need_py hf_families_window_transformers torch transformers; then
    versus_transformers mistral
    versus_transformers qwen2_window
fi
# bad input: where it stands in the file
W="$UST validate $TMP/eq.yaml --set model.arch=llama --set model.n_layer=2"
printf 'model: {arch: llama, n_layer: 2,\n  sliding_window: 0}\n' >$TMP/w0.yaml
expect_exit window_0_exits_2 2 "w0.yaml:2:19: model.sliding_window: item 0 is out of range \(must be in 1..16777216\)" -- \
    $UST validate $TMP/w0.yaml
printf 'model: {arch: llama, n_layer: 2,\n  sliding_window: [8, -4]}\n' >$TMP/wneg.yaml
expect_exit window_negative_exits_2 2 "wneg.yaml:2:23: model.sliding_window: expected a list of integers in 1..16777216, got '-4'" -- \
    $UST validate $TMP/wneg.yaml
printf 'model: {arch: llama, n_layer: 2,\n  sliding_window: [8, 8, 8]}\n' >$TMP/wlen.yaml
expect_exit window_list_wrong_length_exits_2 2 "wlen.yaml:2:19: model.sliding_window has 3 entries; it takes one window for every layer or one per layer \(model.n_layer = 2\)" -- \
    $UST validate $TMP/wlen.yaml
# two sizes are computed (test/sh/window_sizes.sh); the validation names them
expect_exit window_two_sizes_validate_prints_them 0 "attention: sliding windows \[8,4\] \(2 layers windowed of 2\)" -- \
    $W --set model.sliding_window=8,4
expect_exit window_longer_than_the_sequence_is_full 0 "sliding window of 40 keys on 2 of 2 layers \(>= train.seq_len: full attention in training" -- \
    $W --set model.sliding_window=40
expect_exit window_past_max_seq_len_is_full 0 "attention: sliding window \[4096\] >= model.max_seq_len \(64\): full attention" -- \
    $W --set model.sliding_window=4096 --set model.max_seq_len=64
expect_exit window_on_gpt2_exits_2 2 "model.sliding_window applies to llama" -- \
    $UST validate $TMP/eq.yaml --set model.arch=gpt2 --set model.sliding_window=8
exit 0
