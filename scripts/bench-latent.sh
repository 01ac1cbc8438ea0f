#!/usr/bin/env bash
# The latent ring's benchmark of `make bench`, one run: a small multi-head latent attention
# model (the context-parallel benchmark's llama with 8 MLA heads, T=1024) at cp=4 on the zigzag
# ring, passing the latent (model.mla.cp_latent, the default) and the per-head K/V: step time and
# the bytes the cp group sent per step (comm_bytes_cp_group, every rank's summed); then the
# formula's figure for DeepSeek-V3's shape (docs/deepseek.md); and generate's cache bytes per token
# against a same-size GQA model.
. "$(dirname "$0")/bench-lib.sh"
MLA=(--set model.mla.enabled=true --set model.mla.q_lora_rank=64 --set model.mla.kv_lora_rank=64
     --set model.mla.qk_nope_head_dim=32 --set model.mla.qk_rope_head_dim=16
     --set model.mla.v_head_dim=32)
for lat in true false; do
    bench_run "latent-$lat" 4 configs/bench-cp-llama.yaml --set parallel.cp=4 \
        --set parallel.cp_comm=ring --set model.n_head=8 --set model.n_kv_head=8 \
        "${MLA[@]}" --set model.mla.cp_latent=$lat --set train.seq_len=1024 \
        --set model.max_seq_len=1024 --set train.steps=3
done
# generate's cache per token: the MLA model against a same-size GQA llama (8 query heads of 32
# over 2 key/value heads), each trained one step at T=1024 and asked for 4 greedy tokens
printf 'The quick brown fox' >"$TMP/prompt.txt"
for m in mla gqa; do
    S=("${MLA[@]}")
    [ $m = gqa ] && S=(--set model.n_kv_head=2)
    $UST train configs/bench-cp-llama.yaml --set model.n_head=8 --set model.n_kv_head=8 "${S[@]}" \
        --set train.seq_len=1024 --set model.max_seq_len=1024 --set train.steps=1 \
        --set checkpoint.every=1 --set checkpoint.dir="$TMP/ck-$m" >"$TMP/ck-$m.out" 2>&1 ||
        { echo "bench-latent: training the $m model failed:"; tail -3 "$TMP/ck-$m.out"; exit 1; }
    $UST generate "$TMP/ck-$m" --prompt-file "$TMP/prompt.txt" --tokenizer bytes --temperature 0 \
        --max-new-tokens 4 2>&1 >/dev/null | sed -n 's/.*cache \([0-9]*\) bytes per token.*/\1/p' >"$TMP/cache-$m"
done
python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
print("bench latent: MLA 2x256, 8 heads (latent 64 + rope 16, head 32 + 16), T=1024, B=1, cp=4 zigzag ring, 1 thread per rank (steps after the first)")
sent = {}
for lat in ("true", "false"):
    rows = [json.loads(l) for l in open(f"{tmp}/latent-{lat}.jsonl")][1:]
    ms = sum(r["step_ms"] for r in rows) / len(rows)
    sent[lat] = rows[-1]["comm_bytes_cp_group"]
    name = "latent ring" if lat == "true" else "per-head K/V"
    print(f"  {name:<14} {ms:8.0f} ms/step  cp group sent {sent[lat] / 2**20:7.2f} MiB/step")
print(f"  latent / K/V bytes: {sent['true'] / sent['false']:.4f}")
mla, gqa = (int(open(f"{tmp}/cache-{m}").read() or 0) for m in ("mla", "gqa"))
print(f"  generate's cache: MLA {mla} bytes per token against {gqa} for a same-size GQA llama"
      f" (8 heads of 32, 2 kv heads): {mla / gqa:.3f}x" if mla and gqa else "  generate's cache: not printed")
# DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64 a token against 128 heads' k (192) and v
# (128, padded to 192 as the training path sends it); on a zigzag ring of n every block hops n-1
# ranks: the latent n-1 forward, n-1 backward and its gradient n-1 (none on the first hop), K/V
# n-1, n-1 and their gradients n (parallel/cp.c)
lat, kv, n = 512 + 64, 2 * 128 * 192, 4
step = 3 * (n - 1) * lat / ((2 * (n - 1) + n) * kv)
print(f"  DeepSeek-V3 (formula): a block's latent {lat} values a token against K/V {kv}: 1/{kv / lat:.1f}"
      f" a hop; a cp=4 zigzag step: 1/{1 / step:.1f} (unpadded v: K/V {128 * 320}, 1/{128 * 320 / lat:.1f} a hop)")
PY
