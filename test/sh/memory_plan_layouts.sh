#!/usr/bin/env bash
# `ustrain validate` prints each rank's memory from the config alone; under tensor, sequence and
# context parallelism (and their mixes with dp/ZeRO) it equals the arena rank 0 allocates, byte
# for byte.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: plan, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 8, n_kv_head: 4, d_ff: 128, vocab_size: 500, max_seq_len: 64}
train: {steps: 1, seq_len: 32, micro_batch_size: 1, global_batch_size: 4}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {every: 0, resume: none}
EOT
sed -e 's/arch: llama/arch: gpt2/' -e 's/n_kv_head: 4/n_kv_head: 8/' $TMP/c.yaml >$TMP/g.yaml
check() { # check CONFIG NAME WORLD SETS...
    local cfg=$1 name=$2; shift 2
    plan_matches_arena $name $cfg "$@"
}
check $TMP/c.yaml memory_plan_tp2 2 --set parallel.tp=2
check $TMP/c.yaml memory_plan_tp2_sp 2 --set parallel.tp=2 --set parallel.sp=true
check $TMP/c.yaml memory_plan_cp2_ring 2 --set parallel.cp=2
check $TMP/c.yaml memory_plan_cp4_allgather 4 --set parallel.cp=4 --set parallel.cp_comm=allgather
check $TMP/c.yaml memory_plan_tp2_cp2_dp2_zero3 8 --set parallel.tp=2 --set parallel.cp=2 --set parallel.dp=2 --set optimizer.zero_stage=3
check $TMP/g.yaml memory_plan_gpt2_tp4_sp_dp2_zero1 8 --set parallel.tp=4 --set parallel.sp=true --set parallel.dp=2 --set optimizer.zero_stage=1
check $TMP/g.yaml memory_plan_gpt2_tp2_recompute_full 2 --set parallel.tp=2 --set train.recompute=full
# pipelines: rank 0 holds stage 0 (and stage pp under interleaving) with as many micro-batches
# in flight as its schedule keeps (afab: all 4; 1f1b: pp; zb adds what W needs)
check $TMP/c.yaml memory_plan_pp2_afab 2 --set parallel.pp=2 --set parallel.pp_schedule=afab
check $TMP/c.yaml memory_plan_pp2_1f1b_dp2_zero1 4 --set parallel.pp=2 --set parallel.dp=2 --set optimizer.zero_stage=1 --set train.global_batch_size=8
check $TMP/g.yaml memory_plan_gpt2_pp2_zb_zero2 4 --set parallel.pp=2 --set parallel.pp_schedule=zb --set parallel.dp=2 --set optimizer.zero_stage=2 --set train.global_batch_size=8
check $TMP/g.yaml memory_plan_gpt2_pp2_vpp2_tp2_sp 4 --set model.n_layer=4 --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_schedule=interleaved --set parallel.tp=2 --set parallel.sp=true
check $TMP/c.yaml memory_plan_pp2_zero3_selective 4 --set parallel.pp=2 --set parallel.dp=2 --set optimizer.zero_stage=3 --set train.recompute=selective --set train.global_batch_size=8
check $TMP/c.yaml memory_plan_pp2_cp2_full 4 --set parallel.pp=2 --set parallel.cp=2 --set train.recompute=full
check $TMP/c.yaml memory_plan_pp2_uneven_layers 2 --set model.n_layer=4 --set parallel.pp=2 --set parallel.pp_layers=3,1
# mixture of experts: a MoE layer's dense and expert units (the experts sharded over expert-dp x cp
# under ZeRO), its saved routing and expert activations, the dispatch buffers
M="--set model.moe.num_experts=4 --set model.moe.d_ff_expert=64"
check $TMP/c.yaml memory_plan_moe_ep2_dp2 2 $M --set parallel.dp=2 --set parallel.ep=2
check $TMP/g.yaml memory_plan_gpt2_moe_shared_ep2_dp4_zero2 4 $M --set model.moe.shared_expert=true --set parallel.dp=4 --set parallel.ep=2 --set optimizer.zero_stage=2
check $TMP/c.yaml memory_plan_moe_every2_pp2_tp2_sp_zero3 8 $M --set model.n_layer=4 --set model.moe.every=2 --set parallel.pp=2 --set parallel.tp=2 --set parallel.sp=true --set parallel.dp=2 --set parallel.ep=2 --set optimizer.zero_stage=3
check $TMP/c.yaml memory_plan_moe_recompute_full_cp2 4 $M --set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=2 --set train.recompute=full
check $TMP/c.yaml memory_plan_moe_capacity_ep2_dp2 2 $M --set parallel.dp=2 --set parallel.ep=2 --set model.moe.capacity_factor=1.25
check $TMP/c.yaml memory_plan_moe_capacity_cp2 2 $M --set parallel.cp=2 --set model.moe.capacity_factor=1.0
# the tp ranks' token split (its gradient scratch, the tp parts' choices for the capacity), the
# balancing bias and the per-sequence statistics of the sequence-wise loss
check $TMP/c.yaml memory_plan_moe_tp2_capacity_bias_seq 2 $M --set parallel.tp=2 --set model.moe.capacity_factor=1.0 --set model.moe.bias_update_rate=0.01 --set model.moe.seq_aux_loss_coef=0.01 --set train.micro_batch_size=2
# selective recompute leaves the experts' and the shared expert's activation outputs out of every
# MoE layer's saved set (recomputed in backward into the scratch)
check $TMP/c.yaml memory_plan_moe_selective_shared_ep2_dp2 2 $M --set model.moe.shared_expert=true --set train.recompute=selective --set parallel.dp=2 --set parallel.ep=2
# DeepSeek-V3's shape in small (configs/deepseek-v3.yaml): latent attention, a dense first layer,
# sigmoid group-limited routing with a wider shared expert and the balancing bias, a capacity,
# selective recompute; ep 2 and a 1f1b pipeline over the dense/MoE boundary with ZeRO-1
DS="$M --set model.n_layer=4 --set model.n_kv_head=8 --set model.mla.enabled=true --set model.mla.q_lora_rank=24 --set model.mla.kv_lora_rank=16 --set model.mla.qk_nope_head_dim=12 --set model.mla.qk_rope_head_dim=8 --set model.mla.v_head_dim=16 --set model.moe.first_dense=1 --set model.moe.score=sigmoid --set model.moe.n_group=2 --set model.moe.topk_group=1 --set model.moe.shared_expert=true --set model.moe.shared_d_ff=96 --set model.moe.bias_update_rate=0.01 --set model.moe.capacity_factor=1.25 --set train.recompute=selective"
check $TMP/c.yaml memory_plan_deepseek_shape_pp2_ep2_dp2_zero1 4 $DS --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set optimizer.zero_stage=1 --set train.global_batch_size=8
