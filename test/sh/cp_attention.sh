#!/usr/bin/env bash
# Context-parallel attention against single-rank attention over the whole sequence, forward and
# backward, at cp 2 and 4 in both layouts: the ring and its all-gather variant (zigzag balances
# the causal work), Ulysses (a2a: heads split over the ranks; at cp 4 the 2 key/value heads are
# replicated) and the hierarchical a2a+ring (Ulysses over pairs, the ring across), with and
# without document masking; Ulysses' all-to-all bytes equal the formula. With a sliding window
# (and causally under contiguous) the ring sends a block only as far as the last rank whose
# queries see it, and its gradients home from there: the bytes the ring group sends (all ranks
# summed) equal the hand count below.
. "$(dirname "$0")/../lib.sh"
TC=${TC:-build/test/test_cp}
check() { # check N LAYOUT MODE [docs] [window=W] [bytes=N]
    local out rc d="${*:4}"
    out=$(timeout 120 scripts/ustrun --nproc-per-node $1 --no-prefix $TC --ring-check $2 $3 $d 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)'
    [ $rc -eq 0 ] || echo "FAIL cp$1_$2_$3_${d// /_}_run: exit $rc: $(echo "$out" | tail -3)"
}
for n in 2 4; do for layout in zigzag contiguous; do for mode in ring allgather a2a a2a+ring; do
    [ $layout = contiguous ] && [ $mode = allgather ] && continue
    [ $n = 2 ] && [ $mode = a2a+ring ] && continue
    check $n $layout $mode
done; done; done
for mode in ring a2a; do check 2 zigzag $mode docs; done
for mode in a2a a2a+ring; do check 4 contiguous $mode docs; check 4 zigzag $mode docs; done

# The ring's bytes by hand. B=2, T=32, 2 key/value heads of 8 floats: one block's k (or v, dk,
# dv) is 2*8*2*8*4 = 1024 bytes at cp 4 (Tl 8), so a block-send of k and v (or dk and dv) is 2048.
# hops[g]: how far block g travels (its last rank that needs it). Forward sends k,v sum(hops)
# times, backward k,v and dk,dv as often, and dk,dv home once per block with hops > 0.
#  zigzag, full: every rank needs every block, hops 3: 3*12+4 = 40 block-sends = 81920 (the ring
#    as it always was)
#  contiguous, full: rank r needs blocks <= r (causal), hops 3,2,1,0: 3*6+3 = 21 -> 43008
#  contiguous, window 4: rank r needs r-1 and r, hops 1,1,1,0: 3*3+3 = 12 -> 24576
#  zigzag, window 4: chunks of 4, rank r holds chunks r and 7-r, a query reaches 3 keys back
#    into the chunk before, so rank r needs blocks r-1, r, r+1: hops 1,3,3,3 (blocks 1..3 must
#    go round to rank g-1): 3*10+4 = 34 -> 69632
#  a2a+ring contiguous (pairs, Tb 16, 1 kv head each: 1024 per k), window 4: two rings of two
#    blocks, hops 1,0: 3+1 = 4 block-sends per ring -> 2*4*2048 = 16384 (documents too: the
#    route is geometry, documents only skip computing)
check 4 zigzag ring bytes=81920
check 4 contiguous ring bytes=43008
check 4 contiguous ring window=4 bytes=24576
check 4 zigzag ring window=4 bytes=69632
check 4 contiguous ring docs window=4 bytes=24576
check 4 contiguous a2a+ring docs window=4 bytes=16384
check 4 zigzag allgather window=4
check 2 zigzag a2a docs window=4
