# Shared by the scripts/bench-*.sh benchmarks (sourced): the repository root as the working
# directory, a scratch $TMP removed on exit, the demo data, one compute thread per rank, and
# bench_run NAME NPROC CONFIG ARGS..., which trains CONFIG under scripts/ustrun with NPROC ranks
# and leaves the metrics in $TMP/NAME.jsonl.
set -eu
cd "$(dirname "$0")/.."
UST=${UST:-./ustrain}
TMP=$(mktemp -d /tmp/ustrain-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
[ -f data/tiny/train_000.bin ] || $UST data demo data/tiny >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

bench_run() { # bench_run NAME NPROC CONFIG --set ...
    local name=$1 nproc=$2 config=$3
    shift 3
    scripts/ustrun --nproc-per-node "$nproc" "$UST" train "$config" --set train.threads=1 \
        --set "logging.metrics_file=$TMP/$name.jsonl" "$@" >"$TMP/$name.out" 2>&1 ||
        { echo "$(basename "$0"): $name failed:"; tail -5 "$TMP/$name.out"; exit 1; }
}
