#!/usr/bin/env bash
# DualPipeV in the equivalence harness: rank r holds stages r and 2p-1-r (the V), rank 0 both
# ends of the model (gpt2's tied embedding is then one tensor, nothing to sync), rank p-1 hands
# its two chunks to each other locally; B and W split as in zb except where the model keeps no
# deferred weight gradients (MoE layers, full recomputation: whole backwards). pp 2 and 4 with
# dp/ZeRO, tp/sp, cp and ep against one process; checkpoints resumed between dualpipev and 1f1b
# layouts both ways; layouts dualpipev cannot run are refused with exit 2.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-dpv 4 2
# 2p stages: 4 layers for pp=2, 8 for pp=4; 8 micro-batches (dualpipev needs at least 2p)
sed -i -e 's/n_layer: 2/n_layer: 8/' -e 's/global_batch_size: 4/global_batch_size: 8/' \
    $TMP/llama.yaml $TMP/gpt2.yaml
DPV="vpp=2 sched=dualpipev"
EQ="python3 test/tools/equiv.py --steps 4"

$EQ --name _dpv_llama --config $TMP/llama.yaml \
    --layout "pp=2 $DPV" --layout "pp=4 $DPV" --layout "pp=2 $DPV dp=2 zero=2" \
    --layout "pp=2 $DPV tp=2 sp=true" --layout "pp=2 $DPV cp=2" \
    --layout "pp=2 $DPV train.recompute=full" --layout "pp=2 $DPV parallel.pp_layers=3,1,1,3"
$EQ --name _dpv_gpt2 --config $TMP/gpt2.yaml \
    --layout "pp=2 $DPV" --layout "pp=2 $DPV dp=2 zero=1"
