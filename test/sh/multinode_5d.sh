#!/usr/bin/env bash
# Five dimensions over nodes, on the namespace bed (test/sh/multinode_lib.sh) with four
# namespaces: the tiny MoE llama of test/sh/equiv_5d.sh under dp x tp x pp x ep and tp x cp x pp
# on 2 nodes x 4 ranks trains the single-process model; a checkpoint saved on 2 nodes x 4 ranks
# resumes on 4 nodes x 2 ranks, also re-laid out as dp=4 x ep=4 x tp=2 under ZeRO-3 (its
# parameter gathers and gradient reduce-scatters across all four nodes): same losses and weights as
# the uninterrupted single process.
# Skipped with a SKIP line where network namespaces cannot be made.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/multinode_lib.sh"

why=$(mn_skip_reason)
if [ -n "$why" ]; then
    echo "SKIP multinode_5d: $why"
    exit 0
fi
mn_up 4 || { fail multinode_5d_bed "could not make 4 network namespaces"; exit 1; }
mn_launcher 2 $TMP/mnrun2

equiv_configs multinode-5d 4 2
sed -i -e 's/n_layer: 2/n_layer: 4/' \
    -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2, aux_loss_coef: 0.01}}/' \
    $TMP/llama.yaml
# AdamW eps 1e-6: keeps reduction-order noise from flipping a near-tied routing choice (see
# test/sh/equiv_moe.sh)
sed -i 's/^optimizer: {/optimizer: {eps: 1.0e-6, /' $TMP/llama.yaml
EQ="python3 test/tools/equiv.py --steps 4 --config $TMP/llama.yaml"

# 2 nodes x 4 ranks: tp (and cp) inside a node, pp across; dp and ep inside (dp x tp x pp x ep)
$EQ --name _multinode_2x4 --ustrun $TMP/mnrun2 \
    --layout "dp=2 tp=2 pp=2 ep=2 sp=true zero=1" --layout "tp=2 cp=2 pp=2"
# saved on 2 nodes x 4, resumed on 4 nodes x 2 (dp and pp now across nodes too)
$EQ --name _multinode_2x4_to_4x2 --save-ustrun $TMP/mnrun2 --ustrun $TMP/mnrun \
    --save-layout "dp=2 tp=2 pp=2 ep=2 zero=1" --resume-at 2 --layout "dp=2 tp=2 pp=2 ep=2 zero=2" \
    --layout "dp=4 ep=4 tp=2 zero=3"
exit 0
