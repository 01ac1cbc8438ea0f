#!/usr/bin/env bash
# gpu-bundle: prepares, on a machine with the build dependencies and the CUDA toolkit, what a bare
# GPU machine needs to run scripts/gpu-check.sh --bundled without building: the CUDA build of
# ustrain, the GPU test programs and bench_gpu (for any x86-64-v3 CPU, stripped) and the shared
# libraries they use that a CUDA image may lack (libyaml, libcjson, OpenBLAS, PMIx and theirs),
# in .gpubundle/ (git-ignored). CUDA's own libraries (cudart, cuBLAS, cuBLASLt, NCCL) are not
# bundled: the GPU machine's are found there. Usage:
#   scripts/gpu-bundle.sh                      # here; then on the GPU machine, with .gpubundle:
#   scripts/gpu-check.sh --bundled
set -euo pipefail
cd "$(dirname "$0")/.."
G=build-gpu
make -s B=$G BIN=$G/ustrain OPT="-O3 -march=x86-64-v3" -j"$(nproc)" $G/ustrain \
    $G/test/test_cuda_ops $G/test/test_moe $G/test/test_comm $G/bench_gpu
grep -q 'CUDA=1' $G/cuda-config.stamp || { echo "gpu-bundle: nvcc not found: no CUDA build" >&2; exit 1; }
rm -rf .gpubundle
mkdir -p .gpubundle/test .gpubundle/lib
cp $G/ustrain $G/bench_gpu .gpubundle/
cp $G/test/test_cuda_ops $G/test/test_moe $G/test/test_comm .gpubundle/test/
strip .gpubundle/ustrain .gpubundle/bench_gpu .gpubundle/test/*
# every library the programs load, except the C runtime and CUDA's own
for f in .gpubundle/ustrain .gpubundle/bench_gpu .gpubundle/test/*; do ldd "$f"; done |
    awk '$3 ~ /^\// { print $3 }' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/(libcudart|libcublas|libcublasLt|libnccl)\.so' |
    while read -r l; do cp -L "$l" .gpubundle/lib/; done
ls .gpubundle/lib | tr '\n' ' ' | sed 's/^/gpu-bundle: libraries: /'
echo
# compressed: what travels to a GPU machine is limited in size (OpenBLAS alone is ~36 MB)
tar -C .gpubundle -czf .gpubundle/lib.tar.gz lib && rm -rf .gpubundle/lib
du -sh .gpubundle | sed 's/^/gpu-bundle: /'
