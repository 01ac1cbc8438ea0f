#!/usr/bin/env bash
# Expert parallelism: the MoE layer with its experts split over 2 and 4 ranks (all-to-all dispatch
# and combine over the shm backend) against the same layer with every expert local, forward and
# backward, for random and very skewed routing and capacity drops; and the aux-loss statistics
# summed over a stats group against one rank holding every token.
. "$(dirname "$0")/../lib.sh"
TE=${TE:-${BUILD:-build}/test/test_ep}
for n in 2 4; do
    out=$(timeout 300 scripts/ustrun --nproc-per-node $n --no-prefix $TE --ep-check 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)'
    [ $rc -eq 0 ] || echo "FAIL ep${n}_run: exit $rc: $(echo "$out" | tail -3)"
done
