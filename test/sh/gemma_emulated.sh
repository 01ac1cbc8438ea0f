#!/usr/bin/env bash
# Gemma 3's block options on the CUDA backend through the CPU emulator of CUDA and NCCL
# (cuda/emu, `make emu`, strict race checks on; see test/sh/gpu_emulated.sh), on a tiny
# Gemma-shaped model from YAML: GeGLU (model.hidden_act gelu_tanh), norms by 1 + w
# (model.norm_offset) before and after attention and the MLP (model.sandwich_norm), per-head q/k
# norms, head_dim 24 apart from d_model / n_head, query_pre_attn_scalar, embeddings x sqrt(d_model)
# (model.embed_scale), tied embeddings, a windowed layer on rope_local_theta and a full one on
# rope_theta with linear rope_scaling. fp32: one GPU, tp=2 + sp and cp=2 train the CPU run's
# losses for 10 steps (the harness's fp32 tolerance); bf16: tp=2 + sp and cp=2 follow the one-GPU
# bf16 run, and the CPU's fp32 run stays within bf16 noise of it; generate --device cuda gives
# the CPU's greedy tokens and logits.
. "$(dirname "$0")/../lib.sh"

if ! command -v g++ >/dev/null; then
    echo "SKIP gemma_emulated: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
if ! make -s emu -j2 >$TMP/build.log 2>&1; then
    fail gemma_emu_build "make emu failed: $(grep -m3 -E 'error|Error' $TMP/build.log)"
    exit 0
fi
E=build-emu
export EMU_STRICT=1 EMU_GPUS=8
$UST data demo $TMP/data >/dev/null
# one micro-batch of 2 x 32 tokens a step keeps the emulated runs short; layer 0 sees 8 keys
# (rope base 1e4), layer 1 all (window >= max_seq_len: full; rope 1e6, linear x2)
cat >$TMP/gemma.yaml <<EOT
run:   {name: gemma-emu, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, head_dim: 24, d_ff: 128,
        vocab_size: 500, max_seq_len: 64, hidden_act: gelu_tanh, norm_offset: true,
        sandwich_norm: true, embed_scale: true, qk_norm: true, query_pre_attn_scalar: 20,
        tie_embeddings: true, sliding_window: [8, 64], rope_theta: 1000000,
        rope_local_theta: 10000, rope_scaling: {type: linear, factor: 2}}
train: {seq_len: 32, micro_batch_size: 2, global_batch_size: 2}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
EOT
EQ="python3 test/tools/equiv.py --ustrain $E/ustrain --config $TMP/gemma.yaml"
$EQ --name _emu_gemma --steps 10 --layout "run.device=cuda" --layout "tp=2 sp=true run.device=cuda" \
    --layout "cp=2 run.device=cuda"
# bf16 at lr 1e-3: AdamW moves each weight by about lr whatever its gradient's size, so bf16's
# rounding of small gradients (the per-head q/k norms', the norm weights that start at 0) becomes
# lr-sized moves. At lr 3e-3 the 4 steps drift up to 1.3e-3 from the one-GPU bf16 run (past the
# harness's 1e-3; the plain llama's 4e-4; model.qk_norm alone 1.3e-3), at 1e-3 up to 6.5e-4:
# noise proportional to lr (a wrong kernel would not shrink with it, and fp32 above matches 1e-7)
B16="run.device=cuda train.precision=bf16"
$EQ --name _emu_gemma_bf16 --steps 4 --set optimizer.lr=1.0e-3 --ref "$B16" --tolerance bf16 \
    --layout "tp=2 sp=true $B16" --layout "cp=2 $B16" --layout "run.device=cpu"

# generate on the emulated GPU: the CPU's greedy tokens, its logits within fp32 reassociation
$UST train $TMP/gemma.yaml --set train.steps=2 --set checkpoint.dir=$TMP/ck --set checkpoint.every=2 \
    --set run.out_dir=$TMP/run --set logging.metrics_file=$TMP/run/m.jsonl >$TMP/train.log 2>&1 ||
    fail emu_gemma_generate_matches_cpu "training failed: $(tail -2 $TMP/train.log)"
ok=1
for d in cpu cuda; do
    EMU_GPUS=1 $E/ustrain generate $TMP/ck --prompt "Once upon a time, there was" --tokenizer bytes \
        --temperature 0 --max-new-tokens 12 --device $d --dump-logits $TMP/gen-$d.bin \
        >$TMP/gen-$d.out 2>$TMP/gen-$d.err || ok=0
done
[ $ok = 1 ] && cmp -s $TMP/gen-cpu.out $TMP/gen-cuda.out &&
    python3 -c 'import sys, numpy as np
a, b = (np.fromfile(f, dtype=np.float32) for f in sys.argv[1:])
sys.exit(0 if a.size == b.size == 12 * 500 and np.abs(a - b).max() <= 1e-4 * (1 + np.abs(a).max()) else 1)' \
        $TMP/gen-cpu.bin $TMP/gen-cuda.bin &&
    pass emu_gemma_generate_matches_cpu ||
    fail emu_gemma_generate_matches_cpu "$(tail -1 $TMP/gen-cuda.err)"
exit 0
