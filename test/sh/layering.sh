#!/usr/bin/env bash
# The layering of the sources (README "Architecture", issue 19): test/tools/layering.py maps every
# file to its layer and fails on an include or call that goes upward, reaches into cuda/ from
# outside, or lets the model layer talk to the communicators itself. The checker itself is checked:
# copies of the tree with one deliberate violation each (core/moe.c including dp.h, including
# comm.h, calling comm_barrier) must fail.
. "$(dirname "$0")/../lib.sh"

python3 test/tools/layering.py .
mkdir -p $TMP/tree
cp -r core parallel cmd cuda $TMP/tree/
sed -i '0,/#include "moe.h"/s//#include "moe.h"\n#include "dp.h"/' $TMP/tree/core/moe.c
out=$(python3 test/tools/layering.py $TMP/tree 2>&1)
if echo "$out" | grep -q 'FAIL layering_no_include_or_call_goes_upward' &&
   echo "$out" | grep -q 'core/moe.c:[0-9]*: #include "dp.h" (model -> pp/dp)'; then
    pass layering_check_catches_a_deliberate_upward_include
else
    fail layering_check_catches_a_deliberate_upward_include "$(echo "$out" | head -5)"
fi
cp core/moe.c $TMP/tree/core/moe.c
sed -i '0,/#include "moe.h"/s//#include "moe.h"\n#include "comm.h"/' $TMP/tree/core/moe.c
out=$(python3 test/tools/layering.py $TMP/tree 2>&1)
echo "$out" | grep -q 'core/moe.c:[0-9]*: #include "comm.h"' &&
    pass layering_check_catches_the_model_including_comm_h ||
    fail layering_check_catches_the_model_including_comm_h "$(echo "$out" | head -5)"
cp core/moe.c $TMP/tree/core/moe.c
sed -i '0,/^static void statistics/s//static void probe(ust_comm *c) { comm_barrier(c); }\nstatic void statistics/' $TMP/tree/core/moe.c
out=$(python3 test/tools/layering.py $TMP/tree 2>&1)
echo "$out" | grep -q 'core/moe.c:[0-9]*: comm_barrier' &&
    pass layering_check_catches_the_model_calling_comm ||
    fail layering_check_catches_the_model_calling_comm "$(echo "$out" | head -5)"
