#!/usr/bin/env bash
# Ring attention (and its all-gather variant) against single-rank attention over the whole
# sequence, forward and backward, at cp 2 and 4 in both layouts; zigzag balances the causal work.
. "$(dirname "$0")/../lib.sh"
TC=${TC:-build/test/test_cp}
for n in 2 4; do for layout in zigzag contiguous; do for mode in ring allgather; do
    [ $layout = contiguous ] && [ $mode = allgather ] && continue
    out=$(timeout 120 scripts/ustrun --nproc-per-node $n --no-prefix $TC --ring-check $layout $mode 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)'
    [ $rc -eq 0 ] || echo "FAIL cp${n}_${layout}_${mode}_run: exit $rc: $(echo "$out" | tail -3)"
done; done; done
