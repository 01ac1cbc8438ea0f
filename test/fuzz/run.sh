#!/usr/bin/env bash
# Builds the fuzz targets (build.sh) into OUT, replays every committed input of
# test/fuzz/corpus/<target>/ (seeds and the regression inputs of bugs fuzzing found), then fuzzes
# each target for SECONDS. Prints a PASS or FAIL line per step, like the other tests; exit 1 on
# any FAIL. New inputs accumulate in OUT/corpus/<target>/, crashing ones in OUT/artifacts/: fix the
# parser, then copy the input into test/fuzz/corpus/<target>/ as a regression file.
#   test/fuzz/run.sh [OUT [SECONDS [TARGET...]]]     (defaults: build-fuzz 60, every target)
cd "$(dirname "$0")/../.." || exit 1
OUT=${1:-build-fuzz}
SECONDS_EACH=${2:-60}
TARGETS=${*:3}
TARGETS=${TARGETS:-config data ckpt store tokenizer hf prep}
if ! out=$(test/fuzz/build.sh "$OUT" 2>&1); then
    echo "FAIL fuzz_build: $(echo "$out" | tail -5)"
    exit 1
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
bad=0
for t in $TARGETS; do
    mkdir -p "$OUT/corpus/$t" "$OUT/artifacts"
    log="$OUT/fuzz_$t.log"
    if "$OUT/fuzz_$t" -runs=0 "test/fuzz/corpus/$t" >"$log" 2>&1; then
        pass_line="PASS fuzz_${t}_committed_inputs_run_clean"
        echo "$pass_line ($(ls "test/fuzz/corpus/$t" | wc -l) inputs)"
    else
        echo "FAIL fuzz_${t}_committed_inputs_run_clean: $(grep -m1 -E 'ERROR|SUMMARY|runtime error' "$log") (see $log)"
        bad=1
        continue
    fi
    if "$OUT/fuzz_$t" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$OUT/artifacts/$t-" "$OUT/corpus/$t" "test/fuzz/corpus/$t" >"$log" 2>&1; then
        echo "PASS fuzz_${t}_${SECONDS_EACH}s_no_crash ($(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$') inputs)"
    else
        echo "FAIL fuzz_${t}_${SECONDS_EACH}s_no_crash: $(grep -m1 -E 'ERROR|SUMMARY|runtime error' "$log"); input kept in $(grep -o "$OUT/artifacts/[^ ]*" "$log" | tail -1) (log $log)"
        bad=1
    fi
done
exit $bad
