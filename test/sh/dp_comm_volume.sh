#!/usr/bin/env bash
# The bytes each rank sends in its data-parallel group per step, as the comm layer counts them,
# equal the analytic ZeRO volumes for the model's padded flat buffer of P bytes (n = dp, A = grad
# accumulation, scalars = the loss and gradient-norm all-reduces of 2 floats):
#   stage 0, 1:  2(n-1)/n P            (all-reduce; or reduce-scatter + all-gather)
#   stage 2:     (A+1)(n-1)/n P        (reduce-scatter every micro-batch + all-gather)
#   stage 3:     (n-1)/n (A P + 2P - U1 - U2)   (A=1 here: the forward gathers every unit, the
#                backward every unit but the last two, still resident; the padded flat buffer
#                of ZeRO-3 has the vocabulary tables in row chunks of their own units, as
#                many rows as a layer's matrices hold, evened out: dp_model_storage)
# plus the loss's all-reduce (2 floats) and, for stages >= 1, the gradient norm's (4 floats).
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: volume, seed: 7}
model: {arch: llama, n_layer: 3, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 500, max_seq_len: 64}
train: {steps: 2, seq_len: 32, micro_batch_size: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {every: 0, resume: none}
EOT
for n in 2 4; do for z in 0 1 2 3; do
    for A in 1 2; do
        [ $z = 3 ] && [ $A = 2 ] && continue
        gbs=$((2 * n * A))
        m=$TMP/m_${n}_${z}_$A.jsonl
        scripts/ustrun --nproc-per-node $n $UST train $TMP/c.yaml --set parallel.dp=$n --set optimizer.zero_stage=$z \
            --set train.global_batch_size=$gbs --set "logging.metrics_file=$m" >$TMP/out 2>&1 ||
            { fail "dp_volume_n${n}_zero${z}_accum$A" "run failed: $(tail -2 $TMP/out)"; continue; }
        python3 - "$m" $n $z $A <<'PY' && pass "dp_volume_n${n}_zero${z}_accum$A" || fail "dp_volume_n${n}_zero${z}_accum$A" "see above"
import json, sys
path, n, z, A = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
L, C, H, KV, F, V = 3, 64, 4, 2, 96, 500
D = C // H
Vp = (V + 127) // 128 * 128
r16 = lambda x: (x + 15) // 16 * 16
pad = lambda x: (x + 16 * n - 1) // (16 * n) * (16 * n)
layer = [C, D * H * C, D * KV * C, D * KV * C, C * H * D, C, F * C, F * C, C * F]
units = [pad(r16(Vp * C))] + [pad(sum(r16(x) for x in layer))] * L + [pad(r16(C) + r16(Vp * C))]
if z == 3:  # the table and lm_head in k chunks of `rows` rows, the final norm on its own
    rows = 2 * H * D + 2 * KV * D + 3 * F
    k = (Vp + rows - 1) // rows
    rows = (Vp + k - 1) // k
    chunks = [pad(r16(min(rows, Vp - i * rows) * C)) for i in range(k)]
    units = chunks + [pad(sum(r16(x) for x in layer))] * L + [pad(r16(C))] + chunks
P = 4 * sum(units)
f = (n - 1) / n
scal = 2 * f * 8   # the loss: one 2-float all-reduce
norm = 2 * f * 16  # stages >= 1: the gradient norm's two sums in one 4-float all-reduce
want = {0: 2 * f * P + scal,
        1: 2 * f * P + scal + norm,
        2: (A + 1) * f * P + scal + norm,
        3: f * (A * P + 2 * P - 4 * (units[-1] + units[-2])) + scal + norm}[z]
got = [json.loads(l)["comm_bytes_dp"] for l in open(path)]
ok = all(abs(g - want) <= 1 for g in got)
print(f"# n={n} zero={z} A={A}: sent {got} bytes per step, analytic {want:.0f} ({want / P:.3f} P)")
sys.exit(0 if ok else 1)
PY
    done
done; done
