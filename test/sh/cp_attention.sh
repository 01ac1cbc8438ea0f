#!/usr/bin/env bash
# Context-parallel attention against single-rank attention over the whole sequence, forward and
# backward, at cp 2 and 4 in both layouts: the ring and its all-gather variant (zigzag balances
# the causal work), Ulysses (a2a: heads split over the ranks; at cp 4 the 2 key/value heads are
# replicated) and the hierarchical a2a+ring (Ulysses over pairs, the ring across), with and
# without document masking; Ulysses' all-to-all bytes equal the formula.
. "$(dirname "$0")/../lib.sh"
TC=${TC:-build/test/test_cp}
check() { # check N LAYOUT MODE [docs]
    local out rc d=${4:-}
    out=$(timeout 120 scripts/ustrun --nproc-per-node $1 --no-prefix $TC --ring-check $2 $3 $d 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)'
    [ $rc -eq 0 ] || echo "FAIL cp$1_$2_$3${d}_run: exit $rc: $(echo "$out" | tail -3)"
}
for n in 2 4; do for layout in zigzag contiguous; do for mode in ring allgather a2a a2a+ring; do
    [ $layout = contiguous ] && [ $mode = allgather ] && continue
    [ $n = 2 ] && [ $mode = a2a+ring ] && continue
    check $n $layout $mode
done; done; done
for mode in ring a2a; do check 2 zigzag $mode docs; done
for mode in a2a a2a+ring; do check 4 contiguous $mode docs; check 4 zigzag $mode docs; done
