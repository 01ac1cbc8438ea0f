#!/usr/bin/env bash
# The layering of the sources (README "Architecture", issue 19): test/tools/layering.py maps every
# file to its layer and fails on an include or call that goes upward, reaches into cuda/ from
# outside, or lets the model layer talk to the communicators itself. The checker itself is checked:
# copies of the tree with one deliberate violation each (core/moe.c including dp.h, including
# comm.h, calling comm_barrier) must fail, naming the line.
. "$(dirname "$0")/../lib.sh"

python3 test/tools/layering.py .
mkdir -p $TMP/tree
cp -r core parallel cmd cuda $TMP/tree/
# caught NAME SED PATTERN: core/moe.c edited by SED makes the checker print PATTERN
caught() {
    cp core/moe.c $TMP/tree/core/moe.c
    sed -i "$2" $TMP/tree/core/moe.c
    local out
    out=$(python3 test/tools/layering.py $TMP/tree 2>&1)
    echo "$out" | grep -qE "$3" && pass "$1" || fail "$1" "$(echo "$out" | head -5)"
}
caught layering_check_catches_a_deliberate_upward_include \
    '0,/#include "moe.h"/s//#include "moe.h"\n#include "dp.h"/' \
    'core/moe.c:[0-9]+: #include "dp.h" \(model -> pp/dp\)'
caught layering_check_catches_the_model_including_comm_h \
    '0,/#include "moe.h"/s//#include "moe.h"\n#include "comm.h"/' 'core/moe.c:[0-9]+: #include "comm.h"'
caught layering_check_catches_the_model_calling_comm \
    '0,/^static void statistics/s//static void probe(ust_comm *c) { comm_barrier(c); }\nstatic void statistics/' \
    'core/moe.c:[0-9]+: comm_barrier'
