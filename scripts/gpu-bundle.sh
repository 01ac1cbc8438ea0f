#!/usr/bin/env bash
# gpu-bundle: prepares here, on a machine with the build dependencies and the CUDA toolkit,
# everything a bare GPU machine (driver + toolkit, nothing installed) needs to run
# scripts/gpu-check.sh without compiling: in .gpubundle/ (git-ignored; carry it along):
#   ustrain, build/bench_gpu, build/libustrain_cuda.so (the CUDA backend plugin) and
#   build/test/{test_cuda_ops,test_moe,test_comm}: built for any x86-64-v3 CPU in build-gpu/,
#   stripped, laid out as the repository's so the loader finds the plugin beside them;
#   lib.tar.gz: every shared library they load that is not the C runtime's or the toolkit's
#   (libyaml, libcjson, PMIx, OpenBLAS, zstd, OpenSSL, gloo and theirs). Not NCCL: libnccl.so.2
#   is 218 MB and 196 MB gzip'd (its kernels are compressed already), three times the limit;
#   only an NCCL context loads it, and one GPU runs no multi-rank NCCL.
# The bundle must stay within GPU_BUNDLE_MAX_MIB (64: all that travels to a GPU machine); its
# size is printed. The test data is made there by `ustrain data demo`. Usage:
#   scripts/gpu-bundle.sh        # here; then on the GPU machine, with .gpubundle carried:
#   scripts/gpu-check.sh         # finds .gpubundle/ and uses it
set -euo pipefail
cd "$(dirname "$0")/.."
G=build-gpu
MAX=${GPU_BUNDLE_MAX_MIB:-64}
nice -n "${GPU_BUNDLE_NICE:-0}" make -s B=$G BIN=$G/ustrain OPT="-O3 -march=x86-64-v3" -j"${GPU_BUNDLE_JOBS:-$(nproc)}" \
    $G/ustrain $G/test/test_cuda_ops $G/test/test_moe $G/test/test_comm $G/bench_gpu $G/libustrain_cuda.so
grep -q 'CUDA=1' $G/cuda-config.stamp || { echo "gpu-bundle: nvcc not found: no CUDA build" >&2; exit 1; }
rm -rf .gpubundle
mkdir -p .gpubundle/build/test .gpubundle/lib
cp $G/ustrain .gpubundle/
cp $G/bench_gpu $G/libustrain_cuda.so .gpubundle/build/
cp $G/test/test_cuda_ops $G/test/test_moe $G/test/test_comm .gpubundle/build/test/
strip .gpubundle/ustrain .gpubundle/build/bench_gpu .gpubundle/build/test/*
strip --strip-debug .gpubundle/build/libustrain_cuda.so
progs=".gpubundle/ustrain .gpubundle/build/bench_gpu .gpubundle/build/libustrain_cuda.so .gpubundle/build/test/*"
# every library the programs load, except the C runtime and the toolkit's own
for f in $progs; do ldd "$f"; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/(libcudart|libcublas|libcublasLt|libnccl|libcuda)\.so' |
    while read -r l; do cp -L "$l" .gpubundle/lib/; done
ls .gpubundle/lib | tr '\n' ' ' | sed 's/^/gpu-bundle: libraries: /'
echo
tar -C .gpubundle -czf .gpubundle/lib.tar.gz lib && rm -rf .gpubundle/lib
kib=$(du -sk .gpubundle | cut -f1)
echo "gpu-bundle: .gpubundle is $((kib / 1024)) MiB ($kib KiB; limit $MAX MiB):"
(cd .gpubundle && du -ak . | sort -rn | head -8 | sed 's/^/  KiB /')
[ "$kib" -le $((MAX * 1024)) ] || { echo "gpu-bundle: over the $MAX MiB limit" >&2; exit 1; }
