#!/usr/bin/env bash
# Builds the libFuzzer targets test/fuzz/fuzz_*.c with clang (ASan + UBSan) into OUT (default
# build-fuzz): OUT/fuzz_config, fuzz_data, fuzz_ckpt, fuzz_store, fuzz_tokenizer, fuzz_hf. The modules are compiled with
# -fsanitize=fuzzer-no-link, so libFuzzer sees their branches.
# Needs Debian's clang and libclang-rt-dev (scripts/install-deps.sh with
# UST_EXTRA_PKGS="clang libclang-rt-dev" installs them).
set -e
cd "$(dirname "$0")/../.."
OUT=${1:-build-fuzz}
CLANG=${CLANG:-clang}
mkdir -p "$OUT/obj"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# every source folder of the library (the targets, like test/, see all of them)
INC=$(find core parallel -type d | sort | sed 's/^/-I/' | tr '\n' ' ')
CFLAGS="-std=c11 -D_GNU_SOURCE -O1 -g $SAN -Wall -Wextra -Werror -pthread
        -I. $INC -Itest/fuzz $(pkg-config --cflags yaml-0.1 libcjson 2>/dev/null)"
LIBS="$(pkg-config --libs yaml-0.1 libcjson 2>/dev/null || echo -lyaml -lcjson) -lutf8proc -lcrypto -lzstd -lz -lm -pthread"
obj() { echo "$OUT/obj/$(echo "$1" | tr / _ | sed 's/\.c$//').o"; }
# Every module that clang can build without OpenMP/BLAS/PMIx goes into an archive; each target
# links only the members it needs, so modules that split or grow new helpers need no list here.
compile() { # compile SRC: when the source or any header is newer than its object
    local s=$1 o
    o=$(obj "$s")
    if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find core parallel test/fuzz -name '*.h' -newer "$o" | head -1)" ]; then
        $CLANG $CFLAGS -fsanitize=fuzzer-no-link -c "$s" -o "$o" 2>"$o.err" || { rm -f "$o"; return 0; }
    fi
}
export -f compile obj
export OUT CLANG CFLAGS
{ find core parallel -name '*.c' | sort; ls test/fuzz/fuzz_*.c; } | xargs -P "$(nproc)" -I{} bash -c 'compile {}'
for t in test/fuzz/fuzz_*.c; do
    [ -f "$(obj "$t")" ] || { cat "$(obj "$t").err" >&2; exit 1; }
done
rm -f "$OUT/libust-fuzz.a"
ar rcs "$OUT/libust-fuzz.a" $(ls "$OUT"/obj/core_*.o "$OUT"/obj/parallel_*.o 2>/dev/null)
for t in test/fuzz/fuzz_*.c; do
    n=$(basename "$t" .c)
    $CLANG $CFLAGS -fsanitize=fuzzer -o "$OUT/$n" "$(obj "$t")" "$OUT/libust-fuzz.a" $LIBS
done
echo "fuzz targets built in $OUT"
