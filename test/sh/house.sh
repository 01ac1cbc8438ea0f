#!/usr/bin/env bash
# The house's size rules (docs/architecture.md): no function over 80 lines outside CUDA kernels, no
# struct over 30 fields outside op tables, every header opening with a contract of at most 10
# lines (test/tools/house_rules.py), with no exceptions left in the tree. The checker is checked on
# a copy of the tree with a function grown past 80 lines, a struct past 30 fields and a contract
# past 10 lines.
. "$(dirname "$0")/../lib.sh"

python3 test/tools/house_rules.py .
T=$TMP/tree
mkdir -p $T
cp -a core parallel cmd cuda $T/
{
    echo "int house_probe(int x) {"
    for i in $(seq 81); do echo "    x += $i;"; done
    echo "    return x;"
    echo "}"
} >>$T/core/base/rng.c
{
    echo "struct house_probe {"
    for i in $(seq 31); do echo "    int f$i;"; done
    echo "};"
} >>$T/core/base/rng.h
sed -i '1s|^/\* mem:|/* mem:\n * 2\n * 3\n * 4\n * 5\n * 6\n * 7\n *|' $T/core/base/mem.h # 4 + 7 lines
out=$(python3 test/tools/house_rules.py $T 2>&1)
echo "$out" | grep -q "core/base/rng.c:[0-9]* house_probe: 84 lines" && pass house_rules_catch_a_long_function ||
    fail house_rules_catch_a_long_function "$(echo "$out" | head -3)"
echo "$out" | grep -q "core/base/rng.h:[0-9]* house_probe: 31 fields" && pass house_rules_catch_a_wide_struct ||
    fail house_rules_catch_a_wide_struct "$(echo "$out" | head -3)"
echo "$out" | grep -q "core/base/mem.h: 11 lines" && pass house_rules_catch_a_long_contract ||
    fail house_rules_catch_a_long_contract "$(echo "$out" | grep -A3 contract | head -4)"
