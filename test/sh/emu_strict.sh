#!/usr/bin/env bash
# The emulator's strict mode (EMU_STRICT=1, cuda/emu/emu_strict.cpp) proves itself: each kind of
# bug planted in a small kernel (test/emu/strict_kernels.cu) is reported, by kind, naming the
# kernel and the source line, while the same kernel without the bug runs clean. The real kernels
# run under it in test/sh/gpu_emulated*.sh.
. "$(dirname "$0")/../lib.sh"

if ! command -v g++ >/dev/null; then
    echo "SKIP emu_strict: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
if ! make -s emu -j2 >$TMP/build.log 2>&1; then
    fail emu_strict_build "make emu failed: $(grep -m3 -E 'error|Error' $TMP/build.log)"
    exit 0
fi
E=build-emu
OB=/usr/lib/x86_64-linux-gnu/openblas-openmp
python3 cuda/emu/cu2cpp.py test/emu/strict_kernels.cu $TMP/k.cpp
if ! g++ -std=c++17 -O1 -g -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -w \
    -Icuda/emu/include -Icuda $TMP/k.cpp $E/libustrain.a -L$OB -Wl,-rpath,$OB -lopenblas -lyaml \
    -lcjson -lpmix -lzstd -lz -lcrypto -lm -lrt -fopenmp -pthread -o $TMP/k 2>$TMP/cc.log; then
    fail emu_strict_kernels_build "$(head -3 $TMP/cc.log)"
    exit 0
fi
K=test/emu/strict_kernels.cu
L() { grep -nF -- "$1" $K | head -1 | cut -d: -f1; } # L TEXT: the line of the kernels' source holding TEXT
# strict KIND ORDER PATTERN: the buggy kernel is reported (status 3, PATTERN), the correct one is
# not; ORDER is the threads' order between barriers (EMU_ORDER; forward: the default)
strict() {
    local kind=$1 order=$2 pat=$3 out rc
    [ $order = forward ] && order=
    out=$(env EMU_STRICT=1 ${order:+EMU_ORDER=$order} $TMP/k $kind ok 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || [ "$out" != ok ]; then
        fail "emu_strict_${kind}_correct_runs_clean" "exit $rc: $(echo "$out" | head -2)"
    else
        pass "emu_strict_${kind}_correct_runs_clean"
    fi
    out=$(env EMU_STRICT=1 ${order:+EMU_ORDER=$order} $TMP/k $kind bug 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && echo "$out" | grep -qE "$pat"; then
        pass "emu_strict_catches_$kind"
    else
        fail "emu_strict_catches_$kind" "exit $rc: $(echo "$out" | head -2)"
    fi
}
strict neighbour reverse "shared-memory race \(read of another thread's write\) in kernel k_neighbour, block \([01],0,0\): static __shared__ array word [0-9]+ .*: thread [0-9]+ at .*:$(L "out[blockIdx.x * 64 + t] = s[(t + 1) % 64]"); thread [0-9]+ at .*:$(($(L "out[blockIdx.x * 64 + t] = s[(t + 1) % 64]") - 2))"
strict overwrite forward "shared-memory race \(write of what another thread read\) in kernel k_overwrite.* at .*:$(L "s[t] = 2.0f * v")"
strict loop forward "shared-memory race .* in kernel k_loop.*:($(L "s[t] = (float)(t + i)")|$(L "acc += s[63 - t]"))"
strict warp forward "shared-memory race \(write of what another thread read\) in kernel k_warp.*:$(($(L "if (!bug) __syncwarp()") - 1))"
strict blocks forward "global-memory write conflict between blocks .* in kernel k_blocks.*word 0 .*:$(L "out[bug ? 0 : blockIdx.x]")"
strict block_read forward "global-memory race between blocks .* in kernel k_block_read.*:($(L "out[0] = 1.0f")|$(L "bug ? out[0] : 1.0f"))"
strict atomic forward "global-memory race between blocks \(read of another block's write\) in kernel k_atomic, .*:$(L "out[t] += 1.0f")"
strict atomic_mixed forward "global-memory race between blocks \((atomic on what another block wrote|write of what another block updates atomically)\) in kernel k_atomic_mixed"
strict uninit forward "read of shared memory no thread of this block wrote in kernel k_uninit.*word 63 .*:$(L "out[t] = s[63 - t]")"
strict dynamic reverse "shared-memory race .* in kernel k_dynamic.*dynamic shared memory word .*:($(L "sm[t] = (float)t")|$(L "out[t] = sm[63 - t]"))"
strict shfl_exit forward "in kernel k_shfl_exit, block \(0,0,0\), warp 0: lane 0's __shfl_\*_sync mask 0xffffffff names a lane that exited: lane 16"
strict shfl_diverged forward "in kernel k_shfl_diverged, .* mask 0xffffffff names a lane that sits at another sync point \(__syncwarp, mask 0xffffffff\): lane 16"
strict smem_optin forward "kernel k_big_b launched with 65536 bytes of dynamic shared memory: over 48 KiB needs the kernel's own cudaFuncSetAttribute.* it never set"
strict smem_total forward "kernel k_total uses 32768 bytes of static and 204800 of dynamic shared memory per block: over the 227 KiB"
strict fence forward "out-of-bounds read in kernel k_fence, block \(0,0,0\): thread 100 at .*:$(L "if (t < n) dst[t] = src[t]") reads 4 bytes at device heap byte [0-9]+, byte 0 of them 0 bytes past the end of the allocation of 400 bytes"
strict ldsm_diverged forward "in kernel k_ldsm_diverged, block \(0,0,0\), warp 0: lane 0's ldmatrix mask 0xffffffff names a lane that exited: lane 16"
strict cp_async forward "shared-memory access to a cp.async destination before the cp.async.wait_group that lands it in kernel k_cp_async.*:$(L "float b = bug ? ((const float *)s[1])[j]")"
# cp.async writes shared memory at its wait_group in every mode: a read before it sees old bytes
out=$($TMP/k cp_async bug 2>&1)
[ $? -eq 1 ] && echo "$out" | grep -q '^thread' && pass emu_cp_async_lands_at_its_wait_group ||
    fail emu_cp_async_lands_at_its_wait_group "$out"
# bf16 rounding as the hardware does it (always, not only in strict mode): a NaN becomes the
# canonical NaN 0x7FFF, never Inf or -0; ties to even, overflow to Inf
out=$($TMP/k bf16 2>&1) && [ "$out" = ok ] && pass emu_bf16_nan_rounds_to_the_canonical_nan ||
    fail emu_bf16_nan_rounds_to_the_canonical_nan "$out"
# cuBLASLt as documented: a bf16 output takes a bf16 bias (the emulator finds no algorithm for
# an fp32 one, as cuBLASLt may), so a gpt2 layer's bias+GELU GEMMs run fused under bf16; when
# cuBLASLt has no algorithm at all (EMU_LT_FAIL=1) the unfused path runs and says so once
equiv_configs emu-strict 4 4
gpt2() {
    EMU_GPUS=1 $E/ustrain train $TMP/gpt2.yaml --set run.device=cuda --set train.precision=bf16 \
        --set train.steps=1 --set checkpoint.resume=none --set run.out_dir=$TMP/lt \
        --set checkpoint.dir=$TMP/lt/ckpt --set logging.metrics_file=$TMP/lt/m.jsonl 2>&1
}
out=$(EMU_STRICT=1 gpt2)
[ $? -eq 0 ] && ! echo "$out" | grep -q 'cuBLASLt has no algorithm' && pass emu_lt_bias_epilogue_fused_under_bf16 ||
    fail emu_lt_bias_epilogue_fused_under_bf16 "$(echo "$out" | grep -m1 -E 'cuBLASLt|error')"
out=$(EMU_LT_FAIL=1 gpt2)
[ $? -eq 0 ] && [ "$(echo "$out" | grep -c 'cuBLASLt has no algorithm for the fused')" = 1 ] &&
    pass emu_lt_fallback_said_once || fail emu_lt_fallback_said_once "$(echo "$out" | grep -m2 -E 'cuBLASLt|error')"
# mma.m16n8k16's fragment layout, the PTX ISA's table written out in the test, against the
# product attention_tc.cu's mma16816 computes (here its emulated shuffles; on a GPU the
# instruction: the same source compiles with nvcc); and ldmatrix's (cuda/ptx.cuh) likewise
mkdir -p $TMP/inc
python3 cuda/emu/cu2cpp.py cuda/attention_tc.cu $TMP/inc/attention_tc.cu
python3 cuda/emu/cu2cpp.py $K $TMP/km.cpp
if g++ -std=c++17 -O1 -g -w -DMMA_TEST -I$TMP/inc -I$E/cuda -Icuda/emu/include -Icuda -Icore/base \
    $TMP/km.cpp $E/libustrain.a -L$OB -Wl,-rpath,$OB -lopenblas -lyaml -lcjson -lpmix -lzstd -lz \
    -lcrypto -lm -lrt -fopenmp -pthread -o $TMP/km 2>$TMP/ccm.log; then
    out=$($TMP/km mma 2>&1) && [ "$out" = ok ] && pass emu_mma_m16n8k16_and_ldmatrix_fragments_match_the_ptx_table ||
        fail emu_mma_m16n8k16_and_ldmatrix_fragments_match_the_ptx_table "$out"
else
    fail emu_mma_test_build "$(head -3 $TMP/ccm.log)"
fi
# without EMU_STRICT the same bug passes unnoticed: the mode is what catches it
out=$($TMP/k neighbour bug 2>&1) && [ "$out" = ok ] && pass emu_strict_is_off_by_default ||
    fail emu_strict_is_off_by_default "$out"

# the real kernels run under strict mode in test/sh/gpu_emulated*.sh (every op test, training)
exit 0
