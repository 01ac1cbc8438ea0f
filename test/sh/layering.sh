#!/usr/bin/env bash
# The layering (docs/architecture.md): test/tools/layering.py reads the Makefile's layer table and
# checks every object of the build ($BUILD) on what the compiler and linker saw: its .d
# dependencies and its nm undefined symbols. The checker itself is checked: in a copy of the tree
# and its objects, one deliberate violation at a time is compiled (only the touched objects are
# rebuilt) and must fail, naming the place: an upward include in quotes and in angle brackets, the
# model naming comm.h or calling comm_*, an unprefixed call, a name built by a macro, a call from
# C++ (.cc), and an upward include that does not even compile (the folder's include path).
. "$(dirname "$0")/../lib.sh"
BUILD=${BUILD:-build}

python3 test/tools/layering.py . "$BUILD"

# the layer diagram of docs/architecture.md is the table's
if diff <(python3 test/tools/layering.py --diagram .) \
    <(sed -n '/<!-- layers:begin -->/,/<!-- layers:end -->/p' docs/architecture.md | sed '1d;$d') >$TMP/diag.diff; then
    pass layering_diagram_in_docs_is_the_makefile_table
else
    fail layering_diagram_in_docs_is_the_makefile_table "$(head -5 $TMP/diag.diff) (regenerate: python3 test/tools/layering.py --diagram)"
fi

T=$TMP/tree
mkdir -p $T
cp -a core parallel cmd cuda Makefile $T/
mkdir -p $T/build && (cd "$BUILD" && find . \( -name "*.o" -o -name "*.d" -o -name "*.stamp" \) -print0 | tar -cf - --null -T -) | tar -xf - -C $T/build
# violate NAME PATTERN FILE=EDIT...: applies each sed EDIT to FILE in the copy, rebuilds those
# objects, and the checker's output must match PATTERN; then puts files and objects back
violate() {
    local name=$1 pat=$2 out f objs=""
    shift 2
    for fe in "$@"; do
        f=${fe%%=*}
        sed -i "${fe#*=}" $T/$f
        objs="$objs build/${f%.*}.o"
    done
    if ! out=$(make -s -C $T B=build CUDA=0 OPT=-O0 $objs 2>&1); then
        echo "$out" | grep -qE "$pat" && pass "$name" || fail "$name" "did not compile: $(echo "$out" | grep error | head -3)"
    else
        out=$(python3 test/tools/layering.py $T $T/build 2>&1)
        echo "$out" | grep -qE "$pat" && pass "$name" || fail "$name" "$(echo "$out" | grep -A3 FAIL | head -8)"
    fi
    for fe in "$@"; do
        f=${fe%%=*}
        cp -a $f $T/$f
        cp -a "$BUILD/${f%.*}.o" "$BUILD/${f%.*}.d" $T/build/$(dirname $f)/
    done
}
INC='0,/#include "error.h"/s//#include "error.h"\n'
violate layering_catches_an_upward_include "core/model/moe.c:14 \(model -> wrap: parallel/dp.h\)" \
    "core/model/moe.c=${INC}#include \"dp.h\"/"
violate layering_catches_an_upward_include_in_angle_brackets "core/model/moe.c:14 \(model -> wrap: parallel/pp.h\)" \
    "core/model/moe.c=${INC}#include <pp.h>/"
violate layering_catches_the_model_naming_comm_h "FAIL layering_the_model_asks.*|core/model/moe.c:14 \(#include parallel/comm/comm.h\)" \
    "core/model/moe.c=${INC}#include <comm.h>/"
violate layering_catches_the_model_calling_comm "core/model/moe.c:[0-9]+: comm_barrier \(parallel/comm/comm.c\)" \
    "core/model/moe.c=\$a void moe_probe(ust_comm *c) { comm_barrier(c); }"
violate layering_catches_an_unprefixed_upward_call "parallel/comm/comm.c:[0-9]+: is_moe_probe \(comm -> model" \
    "core/model/moe.c=\$a int is_moe_probe(void) { return 1; }" \
    "parallel/comm/comm.c=\$a int is_moe_probe(void);\nint comm_probe(void) { return is_moe_probe(); }"
violate layering_catches_a_call_built_by_a_macro "parallel/tp.c: dp_destroy \(split -> wrap" \
    "parallel/tp.c=\$a #define UP(f) dp_##f\nvoid UP(destroy)(void *);\nvoid tp_probe(void) { UP(destroy)(0); }"
if [ -f "$BUILD/parallel/comm/gloo_store.o" ]; then
    violate layering_catches_an_upward_call_from_cxx "parallel/comm/gloo_store.cc:[0-9]+: train_install_stop_handlers \(comm -> train" \
        "parallel/comm/gloo_store.cc=\$a extern \"C\" void train_install_stop_handlers(void);\nextern \"C\" void gloo_probe(void) { train_install_stop_handlers(); }"
else
    fail layering_catches_an_upward_call_from_cxx "no gloo_store.o in $BUILD (libgloo-dev is installed by scripts/install-deps.sh)"
fi
violate layering_an_include_above_the_folder_does_not_compile "train.h: No such file" \
    "core/model/moe.c=${INC}#include \"train.h\"/"
