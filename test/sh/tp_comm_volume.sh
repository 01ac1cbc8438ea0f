#!/usr/bin/env bash
# Tensor parallelism is real and its traffic is the analytic one. Per micro-batch of N tokens of
# width C (X = N*C*4 bytes, ring all-reduce cost 2(t-1)/t of the buffer) each layer all-reduces
# four activations (attention and MLP outputs forward, their inputs' gradients backward); the
# vocab-parallel embedding and the head add one each, the loss all-gathers N log-sum-exps and
# all-reduces N target logits, and the gradient norm all-reduces two floats once per step.
# Per-rank weights of the split tensors shrink by t (checked through mem_params).
# With sequence parallelism (sp) each all-reduce becomes a reduce-scatter plus an all-gather of
# (t-1)/t X each, and backward all-gathers each norm output again instead of keeping it: per
# layer 6 all-gathers and 4 reduce-scatters, the embedding 1 + 1, the head 2 + 1, and every norm's
# weight gradient (2 per layer + the final one) is all-reduced (C floats). Activations kept
# outside the parallel halves shrink by t.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: tpvolume, seed: 7}
model: {arch: llama, n_layer: 3, d_model: 64, n_head: 8, n_kv_head: 4, d_ff: 128, vocab_size: 500, max_seq_len: 64}
train: {steps: 2, seq_len: 32, micro_batch_size: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {every: 0, resume: none}
EOT
for sp in false true; do for t in 1 2 4; do for A in 1 3; do
    [ $sp = true ] && [ $t = 1 ] && continue
    name=tp_volume_t${t}_accum${A}_sp_$sp
    m=$TMP/m_${t}_${A}_$sp.jsonl
    scripts/ustrun --nproc-per-node $t $UST train $TMP/c.yaml --set parallel.tp=$t --set parallel.sp=$sp \
        --set train.global_batch_size=$((2 * A)) --set "logging.metrics_file=$m" >$TMP/out 2>&1 ||
        { fail $name "run failed: $(tail -2 $TMP/out)"; continue; }
    python3 - "$m" $t $A $sp <<'PY' && pass $name || fail $name "see above"
import json, sys
path, t, A, sp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "true"
L, C, N = 3, 64, 2 * 32
f = 2 * (t - 1) / t
X = N * C * 4
loss = (t - 1) * N * 4 + f * N * 4
if sp:
    per_mb = (10 * L + 2 + 3) * (t - 1) / t * X + loss + (2 * L + 1) * f * C * 4
else:
    per_mb = (4 * L + 2) * f * X + loss
want = A * per_mb + f * 8
got = [json.loads(l)["comm_bytes_tp"] for l in open(path)]
print(f"# tp={t} accum={A}: sent {got} bytes per step, analytic {want:.0f}")
sys.exit(0 if all(abs(g - want) <= 1 for g in got) else 1)
PY
done; done; done
field() { python3 -c "import json; print(json.loads(open('$1').readline())['$2'])"; }
p1=$(field $TMP/m_1_1_false.jsonl mem_params)
p2=$(field $TMP/m_2_1_false.jsonl mem_params)
python3 -c "import sys; sys.exit(0 if 0.45 < $p2 / $p1 < 0.55 else 1)" && pass tp2_halves_the_weights ||
    fail tp2_halves_the_weights "tp=1 $p1 bytes, tp=2 $p2 bytes"
echo "# weights per rank: tp=1 $p1 bytes, tp=2 $p2 bytes"
a2=$(field $TMP/m_2_1_false.jsonl mem_acts)
s2=$(field $TMP/m_2_1_true.jsonl mem_acts)
echo "# activations per rank at tp=2: $a2 bytes without sp, $s2 with"
[ "$s2" -lt "$a2" ] && pass sp_keeps_fewer_activations || fail sp_keeps_fewer_activations "$s2 >= $a2"
