#!/usr/bin/env bash
# The CUDA backend and the NCCL communicator on the CPU emulator (cuda/emu, `make emu`), so the GPU
# code paths run in every `make test` on machines without a GPU:
#   - every op of ops.h on the emulated GPU against the CPU backend (test_cuda_ops), the MoE layer
#     (test_moe), and the NCCL backend at world 1 and 4 (test_comm, every collective and p2p);
#   - run.device=cuda training in one process: fp32 per-step losses and weights against the CPU
#     run, bf16 close to it but not equal, checkpoints moved between GPU and CPU runs, no
#     device allocation after the first step;
#   - bf16 activations: the memory plan equals the arena byte for byte, and the layouts (dp,
#     tp+sp, cp, pp, ep, mixed) train the one-GPU bf16 run's model within bf16 rounding;
#   - the equivalence harness with run.device=cuda over emulated NCCL (dp/ZeRO-1/2/3, tp+sp,
#     pp 1f1b/interleaved/zb with tied embeddings, cp ring/all-gather/a2a, ep, tp x pp x cp,
#     recomputation, MLA on one GPU, tp+sp and cp) against the single-process CPU run, and a
#     rank's dropped gradients caught; run.deterministic: false's one-pass attention backward
#     following the default's losses
#     on that path too;
#   - communication overlaps with computation where the design says (dp buckets during
#     backward, ZeRO-3 prefetch, ring attention's K/V exchange, pipeline sends), and the compute
#     stream, not the host, waits for the NCCL operations;
#   - the emulator's own checks fire: host code reading device memory, a host buffer given to
#     NCCL or to a kernel, a copy in the wrong direction, a write past an allocation, a kernel or
#     copy touching memory of an unfinished NCCL operation (a missing wait: every layout above
#     ran under that check).
# The emulator checks logic: indices, barriers, stream and event order, which pointers live on
# the device. Speed and hardware behaviour need a GPU (scripts/gpu-check.sh).
. "$(dirname "$0")/../lib.sh"

if ! command -v g++ >/dev/null; then
    echo "SKIP gpu_emulated: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
if ! make -s emu -j"$(nproc)" >$TMP/build.log 2>&1; then
    fail emu_build "make emu failed: $(grep -m3 -E 'error|Error' $TMP/build.log)"
    exit 0
fi
pass emu_build
E=build-emu
# strict mode (cuda/emu/emu_strict.cpp): every kernel below runs under the shared- and global-
# memory race checks; test/sh/emu_strict.sh shows each check catching its planted bug
export EMU_STRICT=1
export EMU_GPUS=8
# asynchrony (cuda/emu/emu_rt.h): kernels, GEMMs and copies take effect late, when a sync, an
# event or an NCCL operation needs them; a host read too early sees poison (cases below)
export EMU_ASYNC=1

# run_prefixed NAME CMD...: runs a test program, its PASS/FAIL lines renamed emu_*; a crash fails
run_prefixed() {
    local name=$1; shift
    "$@" >$TMP/out 2>&1
    local rc=$?
    sed -n -e 's/^PASS /PASS emu_/p' -e 's/^FAIL /FAIL emu_/p' $TMP/out
    [ $rc -eq 0 ] || grep -q '^FAIL' $TMP/out || fail "emu_$name" "exit $rc: $(tail -3 $TMP/out)"
}
run_prefixed test_cuda_ops $E/test/test_cuda_ops
run_prefixed test_moe $E/test/test_moe
# the fp-contract mode (make emu-fma): the kernels again with a GPU's FMA contraction (a*b+c
# rounded once, nvcc's default --fmad=true) pass the op tests with the same tolerances
if make -s emu-fma -j"$(nproc)" >$TMP/fma.log 2>&1; then
    objdump -d $E/fma/test_cuda_ops | grep -q vfmadd && pass emu_fma_kernels_are_contracted ||
        fail emu_fma_kernels_are_contracted "no fused multiply-add in $E/fma/test_cuda_ops"
    EMU_STRICT=0 EMU_ASYNC=0 $E/fma/test_cuda_ops >$TMP/fma 2>&1
    rc=$?
    sed -n -e 's/^PASS /PASS emu_fma_/p' -e 's/^FAIL /FAIL emu_fma_/p' $TMP/fma
    [ $rc -eq 0 ] || grep -q '^FAIL' $TMP/fma || fail emu_fma_test_cuda_ops "exit $rc: $(tail -3 $TMP/fma)"
else
    fail emu_fma_build "make emu-fma failed: $(grep -m3 -E 'error|Error' $TMP/fma.log)"
fi
# the NCCL backend: only its cases (the shm ones already ran in the normal build)
EMU_GPUS=4 UST_TEST_ONLY_NCCL=1 $E/test/test_comm >$TMP/comm 2>&1
rc=$?
sed -n -e '/nccl/s/^PASS /PASS emu_/p' -e '/nccl/s/^FAIL /FAIL emu_/p' $TMP/comm
n=$(grep -c '^PASS comm_w4_nccl' $TMP/comm)
[ $rc -eq 0 ] && [ "$n" -gt 20 ] && pass emu_comm_nccl_world4_ran ||
    fail emu_comm_nccl_world4_ran "exit $rc, $n world-4 NCCL cases passed: $(grep -m2 -E '^(FAIL|SKIP)' $TMP/comm)"

# the GPU benchmark's two modes run (their figures mean nothing here): a model's steps end with
# tokens/s and MFU, then the per-op breakdown; the attention benchmark times all three
EMU_REPORT=1 EMU_COUNT=k_to_bf16 $E/bench_gpu 1 32 1 bf16 llama-tiny >$TMP/bench 2>&1 && grep -q 'tokens/s, .* MFU' $TMP/bench &&
    grep -qE '^attention_bwd +4\.0 ' $TMP/bench && grep -q '^total ' $TMP/bench &&
    pass emu_bench_gpu_model_steps || fail emu_bench_gpu_model_steps "$(tail -3 $TMP/bench)"
# cuBLASLt's descriptors and algorithm are built once per problem (ops_cuda.cu lt_lookup): the
# run's hundreds of cuBLASLt GEMMs ask the heuristic once per distinct problem (15 here)
read -r lt_calls lt_heur < <(sed -n 's/^emu: .*cublasLt calls \([0-9]*\).*cublasLt heuristics \([0-9]*\)$/\1 \2/p' $TMP/bench)
[ -n "$lt_heur" ] && [ "$lt_calls" -gt 100 ] && [ "$lt_heur" -le 20 ] &&
    pass emu_cublaslt_descriptors_cached ||
    fail emu_cublaslt_descriptors_cached "cublasLt calls ${lt_calls:-?}, heuristics ${lt_heur:-?} (at most 20 problems)"
# the linears read the bf16 copy of the weights that AdamW writes (ops_cuda_w16.cu): weights are
# rounded (k_to_bf16) in the first of the run's 5 steps only, before AdamW has written the copy,
# which is fewer launches than one step's cuBLASLt GEMMs; rounding per use would round before 2
# of every 3 GEMMs (forward, input gradient) in each of the 5 steps
rounds=$(sed -n 's/^emu: launches of k_to_bf16: \([0-9]*\)$/\1/p' $TMP/bench)
[ -n "$rounds" ] && [ -n "$lt_calls" ] && [ "$rounds" -gt 0 ] && [ $((rounds * 5)) -le "$lt_calls" ] &&
    pass emu_bf16_weights_rounded_in_first_step_only ||
    fail emu_bf16_weights_rounded_in_first_step_only "k_to_bf16 launches ${rounds:-?}, cublasLt calls ${lt_calls:-?} in 5 steps"
$E/bench_gpu attention 1 70 2 32 1 >$TMP/bench 2>&1 &&
    [ "$(grep -cE '^bench_gpu attention (tc|gemm|flash) .*backward' $TMP/bench)" = 3 ] &&
    pass emu_bench_gpu_attention_modes || fail emu_bench_gpu_attention_modes "$(tail -3 $TMP/bench)"
# the roofline counts the attention backward's products of the path in use: 7 (3.5 forward's 2)
# by default, 5 under run.deterministic: false, whose step line says what the opt-in saves
$E/bench_gpu --model-only >$TMP/roof 2>&1 && awk '
    $1 == "attention_fwd" { f = $3 } $1 == "attention_bwd" { b = $3; real = $6 }
    /with run.deterministic: false \(5 attention backward products/ {
        for (i = 1; i < NF; i++) if ($i == "attention_bwd") nd = $(i + 1) }
    END { exit !(f > 0 && b / f > 3.49 && b / f < 3.51 && nd > 0 && nd < real * 0.8) }' $TMP/roof &&
    pass emu_bench_model_only_counts_attention_products ||
    fail emu_bench_model_only_counts_attention_products "$(grep -E 'attention|deterministic' $TMP/roof | head -4)"

# ---- training with run.device=cuda
equiv_configs emu 4 2
# bench train --profile on the GPU path: the op profiler wraps the CUDA backend, whose own calls
# (device memory, allocations) still reach it
EMU_GPUS=1 $E/ustrain bench train configs/tiny.yaml --steps 1 --profile --set run.device=cuda \
    --set train.precision=bf16 --set model.n_layer=1 --set train.seq_len=32 \
    --set train.micro_batch_size=1 --set train.global_batch_size=1 \
    --set "data.train=$TMP/data/train_*.bin" >$TMP/prof 2>&1 &&
    grep -q 'which the step times above include' $TMP/prof && grep -qE '^attention_fwd +1\.0 ' $TMP/prof &&
    pass emu_bench_train_profile_on_cuda || fail emu_bench_train_profile_on_cuda "$(tail -3 $TMP/prof)"

EQ="python3 test/tools/equiv.py --ustrain $E/ustrain --steps 4"
$EQ --name _emu_llama --config $TMP/llama.yaml --layout "run.device=cuda" \
    --layout "dp=2 zero=1 run.device=cuda" --layout "dp=2 zero=3 run.device=cuda" \
    --layout "tp=2 sp=true run.device=cuda" --layout "pp=2 run.device=cuda" \
    --layout "cp=2 run.device=cuda" --layout "tp=2 pp=2 cp=2 run.device=cuda" \
    --layout "cp=2 parallel.cp_comm=allgather run.device=cuda" \
    --layout "cp=2 parallel.cp_comm=a2a run.device=cuda" \
    --layout "dp=2 zero=1 train.recompute=full run.device=cuda" \
    --layout "pp=2 train.recompute=selective run.device=cuda"
sed -i 's/n_layer: 2/n_layer: 4/' $TMP/gpt2.yaml
$EQ --name _emu_gpt2 --config $TMP/gpt2.yaml --layout "pp=2 vpp=2 sched=interleaved run.device=cuda" \
    --layout "pp=2 sched=zb dp=2 zero=2 run.device=cuda"
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, every: 1}}/' \
    -e 's/^optimizer: {/optimizer: {eps: 1.0e-6, /' $TMP/llama.yaml >$TMP/moe.yaml
$EQ --name _emu_moe --config $TMP/moe.yaml --layout "dp=2 ep=2 run.device=cuda" \
    --layout "dp=2 ep=2 tp=2 sp=true zero=1 run.device=cuda"
# model.mtp's modules (composed of existing ops) on the emulated GPU, alone and under tp+sp x pp
sed -e 's/max_seq_len: 64}/max_seq_len: 64, mtp: {depth: 2, loss_weight: 0.3}}/' $TMP/llama.yaml >$TMP/mtp.yaml
$EQ --name _emu_mtp --config $TMP/mtp.yaml --layout "run.device=cuda" \
    --layout "tp=2 sp=true pp=2 run.device=cuda"
# multi-head latent attention (model.mla, with the q latent) composed of the backend's ops: one
# GPU, tp2+sp (the latent's gradients summed over tp) and cp2 train the one-process CPU losses
sed -e 's/n_kv_head: 2/n_kv_head: 4/' -e 's/max_seq_len: 64}/max_seq_len: 64, mla: {enabled: true, q_lora_rank: 24, kv_lora_rank: 16, qk_nope_head_dim: 12, qk_rope_head_dim: 8, v_head_dim: 16}}/' \
    $TMP/llama.yaml >$TMP/mla.yaml
$EQ --name _emu_mla --config $TMP/mla.yaml --layout "run.device=cuda" \
    --layout "tp=2 sp=true run.device=cuda" --layout "cp=2 run.device=cuda"
# cp2 passes the latent (model.mla.cp_latent) and re-expands it: in bf16 too, against one GPU
$EQ --name _emu_mla_bf16 --config $TMP/mla.yaml --ref "run.device=cuda train.precision=bf16" \
    --tolerance bf16 --layout "cp=2 run.device=cuda train.precision=bf16"
# QK-clip and the attention max logit on the emulated GPU (cuda/attention_max.cu), as qkclip.sh
# checks them on the CPU: step 2 from step 1's checkpoint, plain (with logging.stats_every's
# layer_max_logit) and clipped at the median head's logit, against the numpy reference
# (test/tools/qkclip_ref.py: q/k rows times sqrt(tau / max) per head to 2e-6, every other tensor
# bit for bit, the logged maxima the reference's); then clipping at every step (tau 0.05) under
# tp2 x cp2 on emulated GPUs trains the one-process CPU run (world max over device tables)
if need_py emu_qkclip numpy safetensors; then
    SHARD=$(ls $TMP/data/train_*.bin | head -1)
    QK="$E/ustrain train $TMP/llama.yaml --set run.device=cuda --set optimizer.name=muon --set train.steps=2 --set checkpoint.every=1 --set checkpoint.keep_last=5"
    $QK --set optimizer.qk_clip_threshold=1e30 --set logging.stats_every=1 --set checkpoint.dir=$TMP/qk/plain \
        --set checkpoint.resume=none --set logging.metrics_file=$TMP/qk/plain.jsonl >$TMP/qk.out 2>&1 &&
        tau=$(python3 test/tools/qkclip_ref.py tau $TMP/qk/plain/step_1 $SHARD 4 4) &&
        $QK --set optimizer.qk_clip_threshold=$tau --set checkpoint.dir=$TMP/qk/clip \
            --set checkpoint.resume=$TMP/qk/plain/step_1 --set logging.metrics_file=$TMP/qk/clip.jsonl >$TMP/qk.out 2>&1 ||
        fail emu_qkclip_runs "$(tail -2 $TMP/qk.out)"
    python3 test/tools/qkclip_ref.py check $TMP/qk/plain/step_1 $SHARD 4 4 "${tau:-1}" $TMP/qk/plain/step_2 \
        $TMP/qk/clip/step_2 $TMP/qk/clip.jsonl >$TMP/qk.ref 2>&1 &&
        pass "emu_qkclip_on_cuda_matches_numpy $(cut -c6- $TMP/qk.ref)" || fail emu_qkclip_on_cuda_matches_numpy "$(tail -2 $TMP/qk.ref)"
    python3 test/tools/qkclip_ref.py stats $TMP/qk/plain/step_1 $SHARD 4 4 $TMP/qk/plain.jsonl 2 >$TMP/qk.ref 2>&1 &&
        pass "emu_layer_max_logit_on_cuda_matches_numpy $(cut -c6- $TMP/qk.ref)" ||
        fail emu_layer_max_logit_on_cuda_matches_numpy "$(tail -2 $TMP/qk.ref)"
    sed -e 's/^optimizer: {/optimizer: {name: muon, qk_clip_threshold: 0.05, /' $TMP/llama.yaml >$TMP/qkclip.yaml
    $EQ --steps 3 --name _emu_qkclip --config $TMP/qkclip.yaml --layout "tp=2 cp=2 run.device=cuda"
    # under bf16 the rescale (to_device into the fp32 master weights) drops those rows from the bf16
    # weight copy (ops_cuda_w16.cu), so the next step's linears round the clipped q/k weights
    # afresh (k_to_bf16) rather than read the stale copy: more rounding launches than unclipped
    # (264 against 232 in 3 steps); without the drop the counts are equal
    for tau in 1e30 0.05; do
        EMU_GPUS=1 EMU_REPORT=1 EMU_COUNT=k_to_bf16 $E/ustrain train $TMP/llama.yaml --set run.device=cuda \
            --set train.precision=bf16 --set optimizer.qk_clip_threshold=$tau --set train.steps=3 \
            --set checkpoint.every=0 --set checkpoint.resume=none --set run.out_dir=$TMP/w16o_$tau \
            --set logging.metrics_file=$TMP/w16o_$tau/m.jsonl 2>&1 | sed -n 's/^emu: launches of k_to_bf16: //p' >$TMP/w16_$tau
    done
    [ -s $TMP/w16_0.05 ] && [ "$(cat $TMP/w16_0.05)" -gt "$(cat $TMP/w16_1e30)" ] &&
        pass "emu_qkclip_bf16_rescale_drops_the_weight_copy ($(cat $TMP/w16_1e30) -> $(cat $TMP/w16_0.05) roundings)" ||
        fail emu_qkclip_bf16_rescale_drops_the_weight_copy "k_to_bf16 launches $(cat $TMP/w16_1e30) unclipped, $(cat $TMP/w16_0.05) clipped"
fi
# run.deterministic: false on the tensor-core path (bf16, head dim 16): FlashAttention-2's one-pass
# backward (dq by fp32 atomics, cuda/attention_tc.cu k_tc_bwd1) ran, and its 4 steps' losses
# follow the default two-kernel run's within 1e-4 (the dq sums in another order, then rounded)
nd() {
    EMU_GPUS=1 EMU_REPORT=1 EMU_COUNT='k_tc_dq_finish<T>' $E/ustrain train $TMP/llama.yaml \
        --set run.device=cuda --set train.precision=bf16 --set run.deterministic=$1 \
        --set train.steps=4 --set checkpoint.every=0 --set checkpoint.resume=none \
        --set run.out_dir=$TMP/nd_$1 --set logging.metrics_file=$TMP/nd_$1/m.jsonl 2>&1 |
        sed -n 's/^emu: launches of k_tc_dq_finish<T>: //p' >$TMP/nd_$1.n
}
nd true
nd false
d=$(python3 -c '
import json, sys
l = [[r["loss"] for r in map(json.loads, open(f)) if "loss" in r and "val_loss" not in r] for f in sys.argv[1:]]
print("%.3g" % max(abs(a - b) for a, b in zip(*l)) if len(l[0]) == len(l[1]) == 4 else "missing")
' $TMP/nd_true/m.jsonl $TMP/nd_false/m.jsonl 2>&1)
[ "$(cat $TMP/nd_true.n)" = 0 ] && [ "$(cat $TMP/nd_false.n)" -gt 0 ] &&
    python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1e-4)" "$d" 2>/dev/null &&
    pass "emu_nondeterministic_attention_follows_deterministic_losses (largest |diff| $d)" ||
    fail emu_nondeterministic_attention_follows_deterministic_losses "one-pass launches $(cat $TMP/nd_true.n) deterministic, $(cat $TMP/nd_false.n) opt-in; loss diff $d"
# checkpoints cross devices: saved on (emulated) GPUs, resumed on the CPU and the other way
$EQ --name _emu_ckpt --config $TMP/llama.yaml --save-layout "dp=2 zero=3 run.device=cuda" \
    --resume-at 2 --layout "dp=1" --layout "tp=2 run.device=cuda"
$EQ --name _emu_ckpt_cpu --config $TMP/llama.yaml --save-layout "dp=2" --resume-at 2 \
    --layout "run.device=cuda"
# the harness sees a lost gradient on this path as well
$EQ --name _emu_fault --config $TMP/llama.yaml --expect-fail --env UST_FAULT_DP_DROP_GRADS_RANK=1 \
    --layout "dp=2 zero=1 run.device=cuda"

# bf16 activations across ranks: every layout against the one-GPU bf16 run, within bf16 rounding
# (equiv.py --tolerance bf16), and a rank's lost gradients still caught
B16="run.device=cuda train.precision=bf16"
$EQ --name _emu_bf16 --config $TMP/llama.yaml --ref "$B16" --tolerance bf16 \
    --layout "dp=2 zero=3 $B16" --layout "tp=2 sp=true $B16" --layout "cp=2 $B16" \
    --layout "tp=2 pp=2 cp=2 $B16" --layout "pp=2 train.recompute=full $B16" \
    --layout "cp=2 parallel.cp_comm=a2a $B16"
$EQ --name _emu_bf16_gpt2 --config $TMP/gpt2.yaml --ref "$B16" --tolerance bf16 \
    --layout "pp=2 sched=zb dp=2 zero=2 $B16" --layout "tp=2 $B16"
$EQ --name _emu_bf16_moe --config $TMP/moe.yaml --ref "$B16" --tolerance bf16 \
    --layout "dp=2 ep=2 tp=2 sp=true zero=1 $B16"
# model.mtp under bf16 activations: one GPU and tp2+sp x pp2 (the modules' embeddings in bf16
# boundary tensors) train the CPU's fp32 losses and weights within bf16 rounding
$EQ --name _emu_bf16_mtp --config $TMP/mtp.yaml --tolerance bf16 --layout "$B16" \
    --layout "tp=2 sp=true pp=2 $B16"
$EQ --name _emu_bf16_fault --config $TMP/llama.yaml --ref "$B16" --tolerance bf16 --expect-fail \
    --env UST_FAULT_DP_DROP_GRADS_RANK=1 --layout "dp=2 zero=1 $B16"

# a machine without a GPU (EMU_GPUS=0): a CUDA config is a usage error at start-up
EMU_GPUS=0 expect_exit emu_no_device_is_a_clear_error 2 'run.device = cuda: no CUDA device available' -- \
    $E/ustrain train $TMP/llama.yaml --set run.device=cuda --set checkpoint.resume=none

# an unknown attention implementation is a usage error naming what is allowed, before training
EMU_GPUS=1 UST_CUDA_ATTENTION=fast expect_exit emu_bad_attention_choice_exits_2 2 \
    'UST_CUDA_ATTENTION=fast: expected auto, gemm, flash or tc' -- \
    $E/ustrain train $TMP/llama.yaml --set run.device=cuda --set checkpoint.resume=none

# bf16: close to the fp32 run, but not equal (the precision switch reaches the kernels)
for p in fp32 bf16; do
    $E/ustrain train $TMP/llama.yaml --set run.device=cuda --set train.precision=$p \
        --set train.steps=4 --set run.out_dir=$TMP/$p --set checkpoint.dir=$TMP/$p/ckpt \
        --set logging.metrics_file=$TMP/$p/m.jsonl >$TMP/$p.log 2>&1 ||
        fail emu_train_$p "$(tail -2 $TMP/$p.log)"
done
paste <(grep -o '"loss":[^,]*' $TMP/fp32/m.jsonl | cut -d: -f2) \
    <(grep -o '"loss":[^,]*' $TMP/bf16/m.jsonl | cut -d: -f2) |
    awk 'BEGIN { n = 0; worst = 0 } { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
         END { if (n == 4 && worst > 0 && worst < 2e-2) print "PASS emu_bf16_close_to_fp32_not_equal";
               else printf "FAIL emu_bf16_close_to_fp32_not_equal: %d steps, worst relative %.3g\n", n, worst }'

# bf16 with context parallelism: each rank's ring attention runs the tensor-core kernels on K/V
# blocks with global positions (a block a query cannot see, a diagonal block) and merges them by
# lse; the losses follow the one-GPU bf16 run within bf16 noise
EMU_GPUS=2 scripts/ustrun --nproc-per-node 2 $E/ustrain train $TMP/llama.yaml --set run.device=cuda \
    --set train.precision=bf16 --set parallel.cp=2 --set train.steps=4 --set run.out_dir=$TMP/bf16cp \
    --set checkpoint.dir=$TMP/bf16cp/ckpt --set logging.metrics_file=$TMP/bf16cp/m.jsonl \
    >$TMP/bf16cp.log 2>&1 || fail emu_train_bf16_cp2 "$(tail -2 $TMP/bf16cp.log)"
paste <(grep -o '"loss":[^,]*' $TMP/bf16/m.jsonl | cut -d: -f2) \
    <(grep -o '"loss":[^,]*' $TMP/bf16cp/m.jsonl | cut -d: -f2) |
    awk 'BEGIN { n = 0; worst = 0 } { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
         END { if (n == 4 && worst < 2e-4) printf "PASS emu_bf16_cp2_ring_attention_follows_one_gpu (worst relative %.2g)\n", worst;
               else printf "FAIL emu_bf16_cp2_ring_attention_follows_one_gpu: %d steps, worst relative %.3g\n", n, worst }'

# bf16 activations: `validate`'s plan (activations at 2 bytes, statistics at 4) equals the arena
# rank 0 allocates, byte for byte, in layouts that move activations (tp+sp, cp, pp zb, ep)
sed -e 's/n_layer: [0-9]*/n_layer: 2/' $TMP/llama.yaml >$TMP/plan.yaml
plan_bf16() { # NAME WORLD SETS...
    local name=$1 world=$2; shift 2
    UST=$E/ustrain plan_matches_arena $name $TMP/plan.yaml $world --set run.device=cuda \
        --set train.precision=bf16 --set train.steps=1 --set run.out_dir=$TMP/$name \
        --set checkpoint.dir=$TMP/$name/ckpt --set checkpoint.every=0 --set checkpoint.resume=none "$@"
}
plan_bf16 emu_bf16_memory_plan_one_gpu 1
plan_bf16 emu_bf16_memory_plan_tp2_sp 2 --set parallel.tp=2 --set parallel.sp=true
plan_bf16 emu_bf16_memory_plan_cp2 2 --set parallel.cp=2
plan_bf16 emu_bf16_memory_plan_pp2_zb 2 --set parallel.pp=2 --set parallel.pp_schedule=zb
plan_bf16 emu_bf16_memory_plan_mtp_pp2 2 --set model.mtp.depth=2 --set parallel.pp=2
plan_bf16 emu_bf16_memory_plan_moe_ep2 2 --set model.moe.num_experts=4 --set model.moe.d_ff_expert=64 \
    --set parallel.dp=2 --set parallel.ep=2
$E/ustrain validate $TMP/plan.yaml --set run.device=cuda --set train.precision=bf16 --world 1 |
    grep -q '^memory plan per rank (fp32, activations bf16;' && pass emu_bf16_plan_says_bf16 ||
    fail emu_bf16_plan_says_bf16 "validate's header does not name bf16 activations"
# and the activations take half the fp32 plan's bytes (statistics aside)
a32=$($E/ustrain validate $TMP/plan.yaml --set run.device=cuda --world 1 | sed -n 's/^  activations *\([0-9.]*\) KiB.*/\1/p')
a16=$($E/ustrain validate $TMP/plan.yaml --set run.device=cuda --set train.precision=bf16 --world 1 |
    sed -n 's/^  activations *\([0-9.]*\) KiB.*/\1/p')
awk -v a="$a32" -v b="$a16" 'BEGIN { r = b / a; if (a > 0 && r > 0.48 && r < 0.56)
    printf "PASS emu_bf16_activations_half_of_fp32 (%s of %s KiB)\n", b, a;
    else printf "FAIL emu_bf16_activations_half_of_fp32: %s KiB vs fp32 %s KiB\n", b, a }'

# memory: the arena and the backend's scratch are reported, and nothing is allocated on the
# device once the first step has sized the scratch
grep -qE '^device memory: arena .* backend scratch .* 0 device allocations after the first step' \
    $TMP/fp32.log && pass emu_no_device_allocation_after_the_first_step ||
    fail emu_no_device_allocation_after_the_first_step "$(grep -m1 '^device memory' $TMP/fp32.log)"

# overlap, as the host issues it (EMU_STATS): how many NCCL operations had kernels issued between
# their post and the host's wait on them. On a GPU those kernels run while the communication
# does. One dp bucket posted when backward ends overlaps with nothing: the control.
overlapped() { # OP SETTINGS...: rank 0's count of OP operations that overlapped with compute
    local op=$1; shift
    rm -rf $TMP/ov
    EMU_STATS=1 scripts/ustrun --nproc-per-node 2 $E/ustrain train $TMP/llama.yaml \
        --set run.device=cuda --set train.steps=2 --set run.out_dir=$TMP/ov \
        --set checkpoint.dir=$TMP/ov/ckpt --set logging.metrics_file=$TMP/ov/m.jsonl "$@" 2>&1 |
        tee $TMP/ov.stats | sed -n "s|^\[rank 0\] emu-stats: $op waited [0-9]* overlapped ||p"
}
check_overlap() { # NAME OP WANT(some|none) SETTINGS...
    local name=$1 op=$2 want=$3; shift 3
    local n
    n=$(overlapped "$op" "$@")
    local ok=0
    [ -n "$n" ] && [ "$want" = some ] && [ "$n" -gt 0 ] && ok=1
    [ -n "$n" ] && [ "$want" = none ] && [ "$n" -eq 0 ] && ok=1
    if [ $ok = 1 ]; then
        pass "emu_overlap_$name"
    else
        fail "emu_overlap_$name" "$op overlapped ${n:-never waited}, expected $want"
    fi
}
check_overlap dp_buckets_with_backward ncclAllReduce some --set parallel.dp=2 --set parallel.dp_bucket_mb=0.01
check_overlap dp_one_bucket_control ncclAllReduce none --set parallel.dp=2 --set parallel.dp_bucket_mb=1000
check_overlap zero3_prefetch ncclAllGather some --set parallel.dp=2 --set optimizer.zero_stage=3
# comm_wait makes the compute stream wait on each NCCL completion (cudaStreamWaitEvent): the host
# waited first for none of that run's collectives, only the setup's barrier (polling: all, 63)
hw=$(sed -n 's/^\[rank 0\] emu-stats: NCCL completions waited for by the host first //p' $TMP/ov.stats)
[ -n "$hw" ] && [ "$hw" -le 1 ] && pass emu_nccl_completions_waited_for_on_the_gpu ||
    fail emu_nccl_completions_waited_for_on_the_gpu "the host waited first for ${hw:-?} NCCL completions (the barrier only: 1)"
check_overlap cp_ring_kv "ncclSend/Recv group" some --set parallel.cp=2
check_overlap pp_sends "ncclSend/Recv group" some --set parallel.pp=2

# ---- the emulator's own checks (a check that never fires proves nothing)
cat >$TMP/misuse.c <<'EOF'
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <unistd.h>
#include "cuda/ops_cuda.h"
int main(int argc, char **argv) {
    float *d, h[16] = {0};
    cudaMalloc((void **)&d, 64);
    switch (argc > 1 ? argv[1][0] : 'x') {
    case 'r': return (int)((volatile float *)d)[3];            /* host reads device memory */
    case 'c': cudaMemcpy(d, h, 16, cudaMemcpyDeviceToHost); break; /* wrong direction */
    case 'o': cudaMemset(d, 0, 128); break;                      /* past the allocation */
    case 'w': case 'm': { /* touching memory an all-reduce still writes: its peer never comes */
        ncclUniqueId id;
        ncclComm_t c;
        cudaStream_t s;
        ust_err e;
        ust_ops *o = ops_cuda_create(0, &e);
        cudaStreamCreateWithFlags(&s, 0);
        ncclGetUniqueId(&id);
        ncclCommInitRank(&c, 2, id, 0);
        ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s);
        if (argv[1][0] == 'w') o->add(o, d, d, d, 4);
        else cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost);
        break;
    }
    case 'k': {                                                  /* host memory to a kernel */
        ust_err e;
        ust_ops *o = ops_cuda_create(0, &e);
        o->add(o, d, d, h, 4);
        break;
    }
    case 'e': case 'E': { /* a kernel after an all-reduce on another stream: long finished, */
        ncclUniqueId id;   /* but only the compute stream's wait on its event ('E') orders it */
        ncclComm_t c;
        cudaStream_t s;
        cudaEvent_t ev;
        ust_err e;
        ust_ops *o = ops_cuda_create(0, &e);
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        ncclGetUniqueId(&id);
        ncclCommInitRank(&c, 1, id, 0);
        ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s);
        cudaEventRecord(ev, s);
        usleep(100000);
        if (argv[1][0] == 'E') cudaStreamWaitEvent((cudaStream_t)o->stream(o), ev, 0);
        o->add(o, d, d, d, 4);
        o->sync(o);
        printf("ok\n");
        break;
    }
    case 'p': case 'P': { /* a host read of a page-locked copy's destination before ('p') and */
        float *pin, one[4] = {1.5f, 1.5f, 1.5f, 1.5f}; /* after ('P') the stream's sync */
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaMallocHost((void **)&pin, 16);
        cudaMemcpyAsync(d, one, 16, cudaMemcpyHostToDevice, s);
        cudaMemcpyAsync(pin, d, 16, cudaMemcpyDeviceToHost, s);
        if (argv[1][0] == 'P') cudaStreamSynchronize(s);
        printf("read %g\n", pin[0]);
        cudaStreamSynchronize(s);
        break;
    }
    case 'u': case 'U': { /* a page-locked copy source refilled before ('u') or after ('U') the */
        float *pin;       /* stream's sync shows the copy done */
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaMallocHost((void **)&pin, 16);
        for (int i = 0; i < 4; i++) pin[i] = 1.0f;
        cudaMemcpyAsync(d, pin, 16, cudaMemcpyHostToDevice, s);
        if (argv[1][0] == 'U') cudaStreamSynchronize(s);
        pin[0] = 2.0f;
        cudaStreamSynchronize(s);
        printf("ok\n");
        break;
    }
    case 'n': {                                                  /* host buffer to NCCL */
        ncclUniqueId id;
        ncclComm_t c;
        ncclGetUniqueId(&id);
        ncclCommInitRank(&c, 1, id, 0);
        ncclAllReduce(h, h, 4, ncclFloat32, ncclSum, c, 0);
        break;
    }
    default: /* correct use: a round trip */
        cudaMemcpy(d, h, 64, cudaMemcpyHostToDevice);
        cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost);
        printf("ok\n");
    }
    return 0;
}
EOF
OB=/usr/lib/x86_64-linux-gnu/openblas-openmp
if gcc -std=c11 -D_GNU_SOURCE -DUST_CUDA -I. -Icore/base -Icuda/emu/include $TMP/misuse.c \
    $E/libustrain.a -L$OB -Wl,-rpath,$OB -lopenblas -lyaml -lcjson -lpmix -lzstd -lz -lcrypto -lm -lrt -fopenmp \
    -pthread -lstdc++ -o $TMP/misuse 2>$TMP/cc.log; then
    expect_exit emu_correct_use_runs 0 '^ok' -- $TMP/misuse x
    for m in "r|host_read_of_device_memory|host code touched device memory" \
        "c|copy_in_the_wrong_direction|the destination is device memory and the source host" \
        "o|write_past_an_allocation|run 64 bytes past their allocation" \
        "n|host_buffer_given_to_nccl|ncclAllReduce send: 0x[0-9a-f]+ is not device memory" \
        "k|host_buffer_given_to_a_kernel|launched by cu_add: argument 3 .* is host memory" \
        "w|kernel_racing_an_unfinished_allreduce|launched by cu_add: argument 1 .* ncclAllReduce on another stream writes, with nothing ordering them" \
        "m|copy_racing_an_unfinished_allreduce|cudaMemcpy reads 16 bytes .* ncclAllReduce on another stream writes" \
        "e|kernel_after_a_finished_allreduce_without_a_wait|launched by cu_add: argument 1 .* ncclAllReduce on another stream writes, with nothing ordering them" \
        "u|pinned_source_refilled_before_its_copy_ran|cudaMemcpyAsync\\(.*HostToDevice\\): the page-locked source changed before the copy ran"; do
        IFS='|' read -r mode what pat <<<"$m"
        out=$($TMP/misuse "$mode" 2>&1)
        rc=$?
        if [ $rc -ne 0 ] && echo "$out" | grep -qE "$pat"; then
            pass "emu_catches_$what"
        else
            fail "emu_catches_$what" "exit $rc: $(echo "$out" | head -2)"
        fi
    done
    # the same programs with the wait, or the sync, in place run clean
    expect_exit emu_kernel_after_a_stream_wait_on_the_allreduce_runs 0 '^ok' -- $TMP/misuse E
    expect_exit emu_pinned_source_refilled_after_the_sync_runs 0 '^ok' -- $TMP/misuse U
    # EMU_ASYNC: a host read of a page-locked copy's destination before the stream's sync sees
    # poison (NaN), after it the data; without the mode the early read passes unnoticed
    $TMP/misuse p 2>&1 | grep -qxE 'read -?nan' && [ "$($TMP/misuse P 2>&1)" = "read 1.5" ] &&
        pass emu_async_early_host_read_sees_poison ||
        fail emu_async_early_host_read_sees_poison "$($TMP/misuse p 2>&1 | head -2) / $($TMP/misuse P 2>&1 | head -2)"
    [ "$(EMU_ASYNC=0 $TMP/misuse p 2>&1)" = "read 1.5" ] && pass emu_async_mode_is_what_catches_the_early_read ||
        fail emu_async_mode_is_what_catches_the_early_read "$(EMU_ASYNC=0 $TMP/misuse p 2>&1 | head -2)"
    # the racing cases' communicators never saw their second rank, so never unlinked their segment
    find /dev/shm -maxdepth 1 -name 'emu-nccl-*' -newer $TMP/misuse -delete 2>/dev/null
else
    fail emu_misuse_build "$(head -3 $TMP/cc.log)"
fi

# --- generate with --device cuda on the emulated GPU: the same greedy tokens and, within fp32
# reassociation, the same logits as the CPU backend, for llama, gpt2 (two prefill chunks of the
# KV cache) and a llama with experts and a shared expert (the router's top-k on the device)
$UST data demo $TMP/gdata >/dev/null
for g in llama gpt2 moe; do
    case $g in
    llama) model="arch: llama, n_kv_head: 2, max_seq_len: 64" ;;
    gpt2) model="arch: gpt2, n_kv_head: 4, max_seq_len: 192" ;;
    moe) model="arch: llama, n_kv_head: 2, max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 48, shared_expert: true}" ;;
    esac
    cat >$TMP/gen-$g.yaml <<EOT
run:   {name: gen-$g, seed: 7}
model: {n_layer: 2, d_model: 64, n_head: 4, d_ff: 96, vocab_size: 300, $model}
train: {steps: 4, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
data:  {train: "$TMP/gdata/train_*.bin", val: null}
checkpoint: {dir: $TMP/gen-$g/ckpt, every: 4}
logging: {metrics_file: $TMP/gen-$g/metrics.jsonl}
EOT
    prompt="Once upon a time, there was"
    [ $g = gpt2 ] && prompt=$(python3 -c 'print(("the quick brown fox jumps over the lazy dog. " * 4)[:150])')
    ok=1
    $UST train $TMP/gen-$g.yaml >$TMP/gen-$g.log 2>&1 || { fail emu_generate_${g}_matches_cpu "training failed"; continue; }
    for d in cpu cuda; do
        EMU_GPUS=1 $E/ustrain generate $TMP/gen-$g/ckpt --prompt "$prompt" --tokenizer bytes --temperature 0 \
            --max-new-tokens 12 --device $d --dump-logits $TMP/gen-$g-$d.bin >$TMP/gen-$g-$d.out 2>$TMP/gen-$g-$d.err || ok=0
    done
    [ $ok = 1 ] && cmp -s $TMP/gen-$g-cpu.out $TMP/gen-$g-cuda.out &&
        python3 -c 'import sys, numpy as np
a, b = (np.fromfile(f, dtype=np.float32) for f in sys.argv[1:])
sys.exit(0 if a.size == b.size == 12 * 300 and np.abs(a - b).max() <= 1e-4 * (1 + np.abs(a).max()) else 1)' \
            $TMP/gen-$g-cpu.bin $TMP/gen-$g-cuda.bin &&
        pass emu_generate_${g}_matches_cpu || fail emu_generate_${g}_matches_cpu "$(tail -1 $TMP/gen-$g-cuda.err)"
done
exit 0
