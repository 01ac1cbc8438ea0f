#!/usr/bin/env bash
# Builds the libFuzzer targets test/fuzz/fuzz_*.c with clang (ASan + UBSan) into OUT (default
# build-fuzz): OUT/fuzz_config, fuzz_data, fuzz_ckpt, fuzz_store. Only the modules the parsers
# need are compiled, with -fsanitize=fuzzer-no-link so libFuzzer sees their branches.
# Needs Debian's clang and libclang-rt-dev (scripts/install-deps.sh with
# UST_EXTRA_PKGS="clang libclang-rt-dev" installs them).
set -e
cd "$(dirname "$0")/../.."
OUT=${1:-build-fuzz}
CLANG=${CLANG:-clang}
mkdir -p "$OUT/obj"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CFLAGS="-std=c11 -D_GNU_SOURCE -O1 -g $SAN -Wall -Wextra -Werror -pthread
        -I. -Icore -Iparallel -Itest/fuzz $(pkg-config --cflags yaml-0.1 libcjson 2>/dev/null)"
LIBS="$(pkg-config --libs yaml-0.1 libcjson 2>/dev/null || echo -lyaml -lcjson) -lm -pthread"
obj() { echo "$OUT/obj/$(echo "$1" | tr / _ | sed 's/\.c$//').o"; }
SRCS="core/config.c core/error.c core/data.c core/fs.c core/rng.c core/ckpt.c parallel/bootstrap_store.c"
for s in $SRCS test/fuzz/fuzz_*.c; do # rebuilt when the source or any header is newer
    o=$(obj "$s")
    if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find core parallel test/fuzz -name '*.h' -newer "$o" | head -1)" ]; then
        $CLANG $CFLAGS -fsanitize=fuzzer-no-link -c "$s" -o "$o"
    fi
done
link() { # link TARGET SRC...: the target and the modules it needs
    local t=$1 s objs=""; shift
    for s in test/fuzz/$t.c "$@"; do objs="$objs $(obj "$s")"; done
    $CLANG $CFLAGS -fsanitize=fuzzer -o "$OUT/$t" $objs $LIBS
}
link fuzz_config core/config.c core/error.c
link fuzz_data core/data.c core/fs.c core/rng.c core/error.c
link fuzz_ckpt core/ckpt.c core/fs.c core/error.c
link fuzz_store parallel/bootstrap_store.c core/error.c
echo "fuzz targets built in $OUT"
