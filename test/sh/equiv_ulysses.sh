#!/usr/bin/env bash
# Ulysses (parallel.cp_comm: a2a) and hierarchical (a2a+ring, parallel.cp_a2a) context
# parallelism in the equivalence harness: cp 2 and 4 and the 2x2 hybrid, zigzag and contiguous,
# grouped-query attention with key/value heads replicated (cp 4 over 2 kv heads), alone and with
# tp (and sp), pp, dp/ZeRO, ep (a2a and the hybrid each), full recompute, document masking;
# resume across cp modes; the cp traffic of every step against the formula; plan equals arena;
# heads that do not split refused before training.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-ulysses 4 2
EQ="python3 test/tools/equiv.py --steps 6"
A2A="parallel.cp_comm=a2a"
HYB="parallel.cp_comm=a2a+ring parallel.cp_a2a=2"

$EQ --name _ulysses_llama --config $TMP/llama.yaml --layout "cp=2 $A2A" --layout "cp=4 $A2A" \
    --layout "cp=2 $A2A parallel.cp_layout=contiguous" --layout "cp=4 $HYB" \
    --layout "cp=4 $HYB parallel.cp_layout=contiguous" --layout "cp=2 tp=2 sp=true $A2A" \
    --layout "cp=2 dp=2 zero=3 $A2A" --layout "cp=2 pp=2 $A2A" --layout "cp=2 dp=2 zero=1 tp=2 $A2A" \
    --layout "cp=4 $HYB pp=2 sched=afab" --layout "cp=4 $HYB tp=2 sp=true" \
    --layout "cp=4 $HYB dp=2 zero=3"
$EQ --name _ulysses_gpt2 --config $TMP/gpt2.yaml --layout "cp=4 $A2A train.recompute=full" \
    --layout "cp=2 tp=2 dp=2 zero=2 $A2A"
$EQ --name _ulysses --config $TMP/llama.yaml --save-layout "cp=2 $A2A" --resume-at 3 \
    --layout "cp=4 $HYB" --layout "cp=2"

# MoE layers beside Ulysses attention: expert parallelism over dp
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 32}}/' \
    $TMP/llama.yaml >$TMP/moe.yaml
$EQ --name _ulysses_moe --config $TMP/moe.yaml --layout "cp=2 dp=2 ep=2 $A2A" \
    --layout "cp=4 dp=2 ep=2 $HYB"

# document masking: Ulysses gathers the documents' starts with the tokens
python3 - $TMP <<'EOT'
import json, random, sys
random.seed(3)
words = "the a cat dog runs sits on mat and of to in is it that".split()
with open(f"{sys.argv[1]}/docs.jsonl", "w") as f:
    for i in range(800):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(2, 9)))}) + "\n")
EOT
$UST data prep --out $TMP/docdata $TMP/docs.jsonl >/dev/null || fail ulysses_doc_prep "data prep failed"
sed -e "s|data:  {train: \"$TMP/data/train_\*.bin\", val: null}|data:  {train: \"$TMP/docdata/train_*.bin\", val: null, doc_mask: true, eot_id: 256}|" \
    $TMP/llama.yaml >$TMP/docs.yaml
grep -q doc_mask $TMP/docs.yaml || fail ulysses_doc_config "sed did not set data.doc_mask"
$EQ --name _ulysses_docs --config $TMP/docs.yaml --layout "cp=2 $A2A" \
    --layout "cp=4 $A2A parallel.cp_layout=contiguous" --layout "cp=4 $HYB"

# traffic: every step's comm_bytes_cp (what this rank sent in its cp groups, the comm counters)
# equals the formula, per layer and micro-batch: Ulysses over a ranks sends (a-1) parts of
# B*Tl*D*4 bytes per head, 2 Hq + 2 Hk forward and 4 Hq + 4 Hk backward (Hq = H/a query heads,
# Hk = Hkv/a key/value heads, or 1 replicated); the hybrid's ring over r = cp/a blocks of
# blk = B*a*Tl*Hk*D*4 bytes moves k, v r-1 hops forward and backward and their gradients r hops
traffic() { # traffic NAME CP TP A SETS...
    local name=$1 cp=$2 tp=$3 a=$4; shift 4
    scripts/ustrun --nproc-per-node $((cp * tp)) $UST train $TMP/llama.yaml --set parallel.cp=$cp \
        --set parallel.tp=$tp "$@" --set train.steps=2 --set checkpoint.resume=none \
        --set checkpoint.every=0 --set logging.metrics_file=$TMP/$name.jsonl >$TMP/$name.out 2>&1 ||
        { fail $name "run failed: $(tail -2 $TMP/$name.out)"; return; }
    python3 - $TMP/$name.jsonl $cp $tp $a <<'PY' && pass $name || fail $name "$(cat $TMP/why)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cp, tp, a = map(int, sys.argv[2:5])
L, m, B, T, H, Hkv, D = 2, 4, 1, 32, 4 // tp, 2 // tp, 16  # the harness llama, 4 micro-batches
Tl, Hq = T // cp, H // a
Hk = Hkv // a if Hkv % a == 0 else 1
r = cp // a
per = (a - 1) * B * Tl * D * 4 * (6 * Hq + 6 * Hk)
blk = B * a * Tl * Hk * D * 4
if r > 1:
    per += 2 * blk * (2 * (r - 1) + r)
want = L * m * per
got = [row.get("comm_bytes_cp") for row in rows]
if got != [want] * 2:
    open(sys.argv[1].rsplit("/", 1)[0] + "/why", "w").write(f"comm_bytes_cp {got}, formula {want}")
    sys.exit(1)
PY
}
traffic ulysses_cp2_traffic_equals_formula 2 1 2 --set $A2A
traffic ulysses_cp4_kv_replicated_traffic_equals_formula 4 1 4 --set $A2A
traffic ulysses_cp2_tp2_traffic_equals_formula 2 2 2 --set $A2A
traffic ulysses_hybrid_2x2_traffic_equals_formula 4 1 2 --set parallel.cp_comm=a2a+ring --set parallel.cp_a2a=2

# the memory plan (`ustrain validate`) equals the arena: the head-split buffers, the staging of
# the all-to-alls, the ring's blocks of the hybrid, the gathered document starts
for l in "2 cp2 $A2A" "4 cp4_kv_replicated $A2A" "4 cp4_hybrid_docs $HYB"; do
    set -- $l
    w=$1 name=$2; shift 2
    cfg=$TMP/llama.yaml; [ $name = cp4_hybrid_docs ] && cfg=$TMP/docs.yaml
    sets=(--set parallel.cp=$w --set checkpoint.resume=none --set checkpoint.every=0 --set train.steps=1)
    for kv in "$@"; do sets+=(--set $kv); done
    plan_matches_arena memory_plan_ulysses_$name $cfg $w "${sets[@]}"
done

# refused with the reason, exit 2, before training
expect_exit ulysses_heads_not_divisible_exits_2 2 "not divisible by 8" -- \
    $UST validate $TMP/llama.yaml --set parallel.cp=8 --set $A2A --world 8
expect_exit ulysses_kv_heads_refused_exits_2 2 "key/value heads" -- \
    $UST validate $TMP/llama.yaml --set model.n_head=6 --set model.n_kv_head=3 --set model.d_model=48 \
    --set parallel.cp=2 --set $A2A --world 2
expect_exit ulysses_cp_a2a_must_divide_exits_2 2 "parallel.cp_a2a" -- \
    $UST validate $TMP/llama.yaml --set parallel.cp=4 --set parallel.cp_comm=a2a+ring \
    --set parallel.cp_a2a=3 --world 4
expect_exit ulysses_cp_a2a_needs_hybrid_exits_2 2 "Ulysses degree of parallel.cp_comm: a2a.ring" -- \
    $UST validate $TMP/llama.yaml --set parallel.cp=4 --set parallel.cp_a2a=2 --world 4
exit 0
