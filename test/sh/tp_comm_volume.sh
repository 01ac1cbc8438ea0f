#!/usr/bin/env bash
# Tensor parallelism is real and its traffic is the analytic one. Per micro-batch of N tokens of
# width C (X = N*C*4 bytes, ring all-reduce cost 2(t-1)/t of the buffer) each layer all-reduces
# four activations (attention and MLP outputs forward, their inputs' gradients backward); the
# vocab-parallel embedding and the head add one each, the loss all-gathers N log-sum-exps and
# all-reduces N target logits, and the gradient norm all-reduces two floats once per step.
# Per-rank weights of the split tensors shrink by t (checked through mem_params).
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: tpvolume, seed: 7}
model: {arch: llama, n_layer: 3, d_model: 64, n_head: 8, n_kv_head: 4, d_ff: 128, vocab_size: 500, max_seq_len: 64}
train: {steps: 2, seq_len: 32, micro_batch_size: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {every: 0, resume: none}
EOT
for t in 1 2 4; do for A in 1 3; do
    name=tp_volume_t${t}_accum$A
    m=$TMP/m_${t}_$A.jsonl
    scripts/ustrun --nproc-per-node $t $UST train $TMP/c.yaml --set parallel.tp=$t \
        --set train.global_batch_size=$((2 * A)) --set "logging.metrics_file=$m" >$TMP/out 2>&1 ||
        { fail $name "run failed: $(tail -2 $TMP/out)"; continue; }
    python3 - "$m" $t $A <<'PY' && pass $name || fail $name "see above"
import json, sys
path, t, A = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
L, C, N = 3, 64, 2 * 32
f = 2 * (t - 1) / t
X = N * C * 4
per_mb = (4 * L + 2) * f * X + (t - 1) * N * 4 + f * N * 4
want = A * per_mb + f * 8
got = [json.loads(l)["comm_bytes_tp"] for l in open(path)]
print(f"# tp={t} accum={A}: sent {got} bytes per step, analytic {want:.0f}")
sys.exit(0 if all(abs(g - want) <= 1 for g in got) else 1)
PY
done; done
p1=$(python3 -c "import json; print(json.loads(open('$TMP/m_1_1.jsonl').readline())['mem_params'])")
p2=$(python3 -c "import json; print(json.loads(open('$TMP/m_2_1.jsonl').readline())['mem_params'])")
python3 -c "import sys; sys.exit(0 if 0.45 < $p2 / $p1 < 0.55 else 1)" && pass tp2_halves_the_weights ||
    fail tp2_halves_the_weights "tp=1 $p1 bytes, tp=2 $p2 bytes"
echo "# weights per rank: tp=1 $p1 bytes, tp=2 $p2 bytes"
