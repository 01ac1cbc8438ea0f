#!/usr/bin/env bash
# Tight address-space limits (issue 18, item 9): under `ulimit -v` every start of ustrain ends
# promptly, with exit 0, or exit 1 and a message naming what could not be mapped (OpenBLAS's
# work buffer: the size and the limit), or the loader's own message for a shared library that
# does not fit (exit 127); never a hang before main or in a step. (OpenBLAS retries a failed
# mmap forever; core/base/blas_guard.c turns that into the exit.)
. "$(dirname "$0")/../lib.sh"

if ldd $UST 2>/dev/null | grep -q libasan; then
    # AddressSanitizer reserves terabytes of shadow address space: no ulimit -v applies to it
    echo "SKIP address_space_limits: $UST is an AddressSanitizer build"
    exit 0
fi
# A CUDA build links no CUDA library (cuda/ops_cuda_load.c and parallel/comm/nccl_api.c dlopen
# them when a CUDA backend or NCCL context is made): nothing of cuBLASLt's or NCCL's ~1 GiB of
# address space is mapped before main, so the limits below hold for it as for `make CUDA=0`.
linked=$(ldd $UST 2>/dev/null | grep -oE 'lib(cudart|cublas|cublasLt|nccl)\.so[.0-9]*' | tr '\n' ' ')
[ -z "$linked" ] && pass binary_links_no_cuda_library || fail binary_links_no_cuda_library "$linked"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
# limited KIB cmd...: cmd under ulimit -v KIB, at most 60 s; prints "rc<TAB>last line"
limited() {
    local kib=$1; shift
    local out rc
    out=$(timeout -k 5 60 bash -c "ulimit -v $kib; exec \"\$@\"" _ "$@" 2>&1); rc=$?
    printf '%s\t%s\n' "$rc" "$(echo "$out" | grep -E 'error|ustrain [0-9]|done:' | tail -1)"
}
hung=""; odd=""; blas=0; fits=""
for mib in $(seq 50 50 4000); do
    r=$(limited $((mib * 1024)) $UST --version)
    rc=${r%%$'\t'*}; msg=${r#*$'\t'}
    case $rc in
        0) fits=$mib; break ;;
        124|137) hung="$hung $mib" ;;
        1) echo "$msg" | grep -q "OpenBLAS could not map its [0-9]*-byte work buffer (the address-space limit, ulimit -v, is $((mib * 1024 / 1024)) MiB" && blas=$((blas + 1)) || odd="$odd $mib:$msg" ;;
        127) echo "$msg" | grep -q "error while loading shared libraries" || odd="$odd $mib:$msg" ;;
        *) odd="$odd $mib:rc$rc:$msg" ;;
    esac
done
[ -z "$hung" ] && pass address_space_limit_never_hangs_at_start || fail address_space_limit_never_hangs_at_start "hung at MiB:$hung"
[ -z "$odd" ] && pass address_space_limit_failures_say_what_did_not_fit || fail address_space_limit_failures_say_what_did_not_fit "$odd"
[ $blas -gt 0 ] && [ -n "$fits" ] && pass openblas_buffer_that_does_not_fit_is_named_with_the_limit ||
    fail openblas_buffer_that_does_not_fit_is_named_with_the_limit "OpenBLAS message seen $blas times; starts at ${fits:-never} MiB"
# a training run just above the start-up need: it trains, or stops with a message; no hang
if [ -n "$fits" ]; then
    bad=""
    for extra in 0 50 100 200 400; do
        r=$(limited $(((fits + extra) * 1024)) $UST train $TMP/c.yaml --set train.steps=3 --set checkpoint.every=0 \
            --set "checkpoint.dir=$TMP/ck$extra" --set "logging.metrics_file=$TMP/m$extra.jsonl")
        rc=${r%%$'\t'*}; msg=${r#*$'\t'}
        case $rc in
            0) echo "$msg" | grep -q "done: 3 steps" || bad="$bad +$extra:$msg" ;;
            1) echo "$msg" | grep -qE "out of memory|cannot (allocate|map)" || bad="$bad +$extra:$msg" ;;
            *) bad="$bad +$extra:rc$rc:$msg" ;;
        esac
    done
    [ -z "$bad" ] && pass training_under_a_tight_limit_trains_or_says_out_of_memory ||
        fail training_under_a_tight_limit_trains_or_says_out_of_memory "$bad"
fi

# Too few file descriptors to read the data directory: the message says so (a glob that cannot
# open a directory matches nothing, which read as "no files match")
out=$( (ulimit -n 4; $UST train $TMP/c.yaml --set train.steps=1 --set checkpoint.resume=none \
    --set "checkpoint.dir=$TMP/ckn" >$TMP/n.out 2>&1); cat $TMP/n.out)
# (where it runs out depends on the descriptors the shell passes down: the reason must be named)
echo "$out" | grep -q "Too many open files" && ! echo "$out" | grep -q "no files match" &&
    pass too_few_file_descriptors_are_named || fail too_few_file_descriptors_are_named "$(echo "$out" | tail -2)"

# A small stack limit (ulimit -s, KiB): it is every thread's stack too, and below ~224 KiB a step
# dies with SIGSEGV (at 64 KiB without a word). Every sub-command refuses it up front, exit 2,
# naming the limit and how to raise it, and writes nothing; at the needed 1024 KiB it trains.
for kib in 64 128 1000; do
    out=$( (ulimit -s $kib; $UST train $TMP/c.yaml --set train.steps=1 --set "checkpoint.dir=$TMP/cks$kib" \
        --set "logging.metrics_file=$TMP/ms$kib.jsonl" >$TMP/s.out 2>&1; echo "rc=$?" >>$TMP/s.out); cat $TMP/s.out)
    echo "$out" | grep -q "rc=2" && echo "$out" | grep -q "stack size limit (ulimit -s) is $kib KiB.*ulimit -s 8192" &&
        [ ! -e $TMP/cks$kib ] && [ ! -e $TMP/ms$kib.jsonl ] &&
        pass "stack_limit_${kib}k_is_refused_with_its_size" || fail "stack_limit_${kib}k_is_refused_with_its_size" "$(echo "$out" | tail -2)"
done
out=$( (ulimit -s 1024; $UST train $TMP/c.yaml --set train.steps=1 --set checkpoint.every=1 --set "checkpoint.dir=$TMP/cks" \
    --set "logging.metrics_file=$TMP/ms.jsonl" >$TMP/s.out 2>&1; echo "rc=$?" >>$TMP/s.out); cat $TMP/s.out)
echo "$out" | grep -q "rc=0" && [ -d $TMP/cks/step_1 ] && pass stack_limit_of_1024k_trains_and_saves ||
    fail stack_limit_of_1024k_trains_and_saves "$(echo "$out" | tail -2)"
