#!/usr/bin/env bash
# A CUDA build on a machine without the CUDA libraries (issue 34, section 1): no binary links
# libcudart, cuBLAS, cuBLASLt or NCCL (cuda/ops_cuda_load.c and parallel/comm/nccl_api.c dlopen
# them when a CUDA backend or an NCCL context is made). With every folder that holds them hidden
# (a mount namespace, an empty tmpfs over each), the binary starts, trains configs/tiny.yaml on
# the CPU, and `run.device: cuda` exits 2 naming the missing library and the search path;
# UST_CUDA_LIB_DIR is searched first; test_cuda_ops SKIPs, or FAILs under UST_REQUIRE_GPU=1; an
# NCCL context names the library too. Needs `unshare -m` (root): else a SKIP line says so.
. "$(dirname "$0")/../lib.sh"
BUILD=${BUILD:-build}

if [ ! -f "$BUILD/libustrain_cuda.so" ]; then
    echo "SKIP cuda_libs_hidden: $BUILD has no CUDA backend plugin (a build without nvcc or CUDA=0)"
    exit 0
fi
if ! unshare -m true 2>/dev/null; then
    echo "SKIP cuda_libs_hidden: unshare -m is not permitted here (needs root or user namespaces)"
    exit 0
fi
$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
cuda_so=$(ls /usr/local/cuda/lib64/libcudart.so.* 2>/dev/null | grep -oE 'libcudart\.so\.[0-9]+$' | head -1)
cuda_so=${cuda_so:-libcudart.so.13}
# a folder with only the runtime: with UST_CUDA_LIB_DIR there, the next library is the missing one
mkdir -p $TMP/rtonly
cp -L "$(ldconfig -p | awk -v s="$cuda_so" '$1 == s {print $NF; exit}')" $TMP/rtonly/ 2>/dev/null ||
    cp -L /usr/local/cuda/lib64/$cuda_so $TMP/rtonly/ 2>/dev/null
# every folder the libraries live in (as the loader finds them), hidden by an empty tmpfs
hide="$(readlink -f /usr/local/cuda 2>/dev/null)"
for f in $(ldconfig -p | grep -E 'lib(cudart|cublas|cublasLt|nccl|cuda)\.so' | awk '{print $NF}'); do
    hide="$hide $(dirname "$(readlink -f "$f")")"
done
hide=$(echo $hide | tr ' ' '\n' | grep . | sort -u | tr '\n' ' ')

cat >$TMP/inside.sh <<EOF
for d in $hide; do # (a folder under one hidden already is gone)
    [ -d "\$d" ] && { mount -t tmpfs none "\$d" || { echo "cannot hide \$d"; exit 3; }; }
done
for f in \$(ldconfig -p | grep -E 'lib(cudart|cublas|cublasLt|nccl)\.so' | awk '{print \$NF}'); do
    [ -e "\$f" ] && { echo "still visible: \$f"; exit 3; }
done
ldd $UST >$TMP/ldd.out 2>&1; echo "rc=\$?" >>$TMP/ldd.out
$UST train $TMP/c.yaml --set train.steps=3 --set checkpoint.every=0 --set checkpoint.dir=$TMP/ck \
    --set logging.metrics_file=$TMP/m.jsonl >$TMP/train.out 2>&1; echo "rc=\$?" >>$TMP/train.out
$UST train $TMP/c.yaml --set run.device=cuda --set checkpoint.dir=$TMP/ck2 >$TMP/cuda.out 2>&1
echo "rc=\$?" >>$TMP/cuda.out
UST_CUDA_LIB_DIR=$TMP/rtonly $UST train $TMP/c.yaml --set run.device=cuda \
    --set checkpoint.dir=$TMP/ck3 >$TMP/dir.out 2>&1; echo "rc=\$?" >>$TMP/dir.out
$BUILD/test/test_cuda_ops >$TMP/ops.out 2>&1; echo "rc=\$?" >>$TMP/ops.out
UST_REQUIRE_GPU=1 $BUILD/test/test_cuda_ops >$TMP/req.out 2>&1; echo "rc=\$?" >>$TMP/req.out
UST_REQUIRE_GPU=1 $BUILD/bench_gpu 1 64 1 >$TMP/bench.out 2>&1; echo "rc=\$?" >>$TMP/bench.out
$UST bench comm --backend nccl --min-bytes 1024 --max-bytes 1024 >$TMP/nccl.out 2>&1; echo "rc=\$?" >>$TMP/nccl.out
EOF
if ! unshare -m bash $TMP/inside.sh >$TMP/ns.out 2>&1; then
    fail cuda_libraries_can_be_hidden "$(tail -2 $TMP/ns.out)"
    exit 0
fi
pass cuda_libraries_can_be_hidden
has() { grep -qE -- "$2" "$TMP/$1.out"; }
last() { tail -3 "$TMP/$1.out" | tr '\n' ' ' | sed 's/^FAIL/(FAIL)/'; }
has ldd 'rc=0' && ! has ldd 'not found|lib(cudart|cublas|nccl)' &&
    pass binary_loads_without_cuda_libraries || fail binary_loads_without_cuda_libraries "$(last ldd)"
has train 'done: 3 steps' && has train 'rc=0' &&
    pass cuda_build_trains_tiny_on_cpu_with_cuda_libraries_hidden ||
    fail cuda_build_trains_tiny_on_cpu_with_cuda_libraries_hidden "$(last train)"
has cuda 'rc=2' && has cuda "run.device = cuda: $cuda_so could not be loaded \(searched: UST_CUDA_LIB_DIR=\(unset\), the standard search" &&
    pass cuda_device_without_libraries_exits_2_naming_the_library_and_search_path ||
    fail cuda_device_without_libraries_exits_2_naming_the_library_and_search_path "$(last cuda)"
has dir 'rc=2' && has dir "libcublasLt\.so\.[0-9]+ could not be loaded \(searched: UST_CUDA_LIB_DIR=$TMP/rtonly" &&
    pass ust_cuda_lib_dir_is_searched_first ||
    fail ust_cuda_lib_dir_is_searched_first "$(last dir)"
has ops 'rc=0' && has ops "^SKIP cuda ops: .*$cuda_so" &&
    pass test_cuda_ops_skips_naming_the_library || fail test_cuda_ops_skips_naming_the_library "$(last ops)"
has req 'rc=1' && has req "^FAIL cuda ops: .*$cuda_so" && has bench 'rc=1' && has bench '^FAIL bench_gpu' &&
    pass ust_require_gpu_turns_the_skip_into_a_failure ||
    fail ust_require_gpu_turns_the_skip_into_a_failure "$(last req) / $(last bench)"
has nccl "comm/nccl: $cuda_so could not be loaded" && ! has nccl 'rc=0' &&
    pass nccl_context_without_libraries_names_the_library ||
    fail nccl_context_without_libraries_names_the_library "$(last nccl)"
