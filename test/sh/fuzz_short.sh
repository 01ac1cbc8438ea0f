#!/usr/bin/env bash
# A short fuzz run of every parser that reads hostile input (issue 10, item 6): the YAML config,
# token shard headers, checkpoint readers, the bootstrap store's frames, tokenizer.json, Hugging Face
# model directories and data prep's inputs (gzip, zstd, binary, JSON lines) and meta.json, each replaying its
# committed corpus (seeds + regression inputs) and then fuzzed for FUZZ_SECONDS (default 5) with
# libFuzzer + ASan + UBSan, built with clang in build-fuzz/. `make fuzz` is the long run.
. "$(dirname "$0")/../lib.sh"

have_libfuzzer() {
    command -v clang >/dev/null && printf 'int LLVMFuzzerTestOneInput(const char *d, long n) { return d && n; }\n' |
        clang -x c -fsanitize=fuzzer,address,undefined -o $TMP/probe - >/dev/null 2>&1
}
if ! have_libfuzzer; then
    UST_EXTRA_PKGS="clang libclang-rt-dev" scripts/install-deps.sh >$TMP/deps 2>&1
fi
if ! have_libfuzzer; then
    echo "SKIP fuzz_short: clang with libFuzzer is not available and could not be installed: $(tail -2 $TMP/deps)"
    exit 0
fi
test/fuzz/run.sh "${FUZZ_BUILD:-build-fuzz}" "${FUZZ_SECONDS:-5}"
