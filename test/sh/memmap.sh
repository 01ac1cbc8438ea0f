#!/usr/bin/env bash
# The memory map on arena overflow (run.memory_limit_mb, core/train/train_memmap.c): an
# allocation that would pass the limit prints the arena by owner beside the memory plan's figure
# for each and writes it as JSON (run.out_dir/memory_map_rank_R.json): the owners sum to the
# arena, the request takes it past the limit, every owner allocated whole equals its plan; the
# activations and scratch are one row per kind of buffer (acts.layer.attn, acts.slot.head, ...),
# none left under the bare category, and the printed rows sum to the printed total; the
# suggestion is the planner's next option for the largest owner (recompute, then ZeRO); exit 2
# before any step; a limit that fits changes nothing; a bad limit is a config error.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
S="--set checkpoint.every=0 --set train.steps=2 --set data.val_every=100"
check() { # NAME RC OUTPUT JSON... : the map's invariants and the suggestion's words
    python3 - "$@" <<'EOT'
import json, sys
name, rc, out, want = sys.argv[1:5]
assert rc == "2", "exit %s" % rc
text = open(out).read()
assert "the arena by owner, beside the plan" in text and "memory map: " in text, text[-400:]
for path in sys.argv[5:]:
    m = json.load(open(path))
    assert sum(m["arena"].values()) == m["arena_total"], m
    assert m["arena_total"] <= m["limit"] < m["arena_total"] + m["request"]["bytes"], m
    for owner in ("params", "grads"):  # allocated whole before the activations
        assert m["arena"][owner] == m["plan"][owner], (owner, m)
    assert sum(m["plan"].values()) == m["plan_total"], m
    assert sum(m["categories"].values()) == m["arena_total"], m
    acts = [k for k in m["plan"] if k.startswith("acts.")]
    assert "activations" not in m["plan"] and "activations" not in m["arena"], m
    for k in ("acts.layer.attn", "acts.layer.mlp", "acts.slot.residual", "acts.slot.head", "acts.scratch"):
        assert m["plan"][k] > 0 and k in text, (k, m)
    assert sum(m["arena"][k] for k in acts) == m["categories"]["activations"], m
    if m["request"]["category"] != "activations":  # past them: every kind allocated whole
        assert all(m["arena"][k] == m["plan"][k] for k in acts), m
    rows = [l.split("]")[-1].split() for l in text.splitlines() if "MiB   plan" in l]
    arena = lambda r: float(r[r.index("MiB") - 1])  # every rank's rows and totals together
    printed = sum(arena(r) for r in rows if r[0] != "total")
    total = sum(arena(r) for r in rows if r[0] == "total")
    assert total > 0, text[-400:]
    assert abs(printed - total) <= 0.005 * len(rows) + 1e-9, (printed, total)
    assert want in m["next"] and want in text, (want, m["next"])
print("ok")
EOT
}
$UST train $TMP/c.yaml $S --set run.memory_limit_mb=20 >$TMP/a.out 2>&1
check a $? $TMP/a.out "train.recompute: selective" $TMP/run/memory_map_rank_0.json >$TMP/a.check 2>&1
grep -q "^ok" $TMP/a.check && ! grep -q "^step" $TMP/a.out && pass memmap_overflow_prints_and_writes_the_owner_map ||
    fail memmap_overflow_prints_and_writes_the_owner_map "$(tail -2 $TMP/a.check) $(tail -2 $TMP/a.out)"
rm -rf $TMP/run
$UST train $TMP/c.yaml $S --set run.memory_limit_mb=20 --set train.recompute=full >$TMP/b.out 2>&1
check b $? $TMP/b.out "optimizer.zero_stage: 1" $TMP/run/memory_map_rank_0.json >$TMP/b.check 2>&1
grep -q "^ok" $TMP/b.check && pass memmap_full_recompute_suggests_the_next_zero_stage ||
    fail memmap_full_recompute_suggests_the_next_zero_stage "$(tail -2 $TMP/b.check) $(tail -2 $TMP/b.out)"
rm -rf $TMP/run
scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $S --set parallel.dp=2 --set run.memory_limit_mb=20 >$TMP/c.out 2>&1
check c 2 $TMP/c.out "train.recompute: selective" $TMP/run/memory_map_rank_0.json $TMP/run/memory_map_rank_1.json >$TMP/c.check 2>&1
grep -q "^ok" $TMP/c.check && pass memmap_every_rank_writes_its_map || fail memmap_every_rank_writes_its_map "$(tail -2 $TMP/c.check) $(ls $TMP/run)"
rm -rf $TMP/run
$UST train $TMP/c.yaml $S --set run.memory_limit_mb=30 >$TMP/e.out 2>&1
check e $? $TMP/e.out "acts.layer.mlp the largest" $TMP/run/memory_map_rank_0.json >$TMP/e.check 2>&1
grep -q "^ok" $TMP/e.check && grep -q "optimizer .*<- this allocation's owner" $TMP/e.out &&
    pass memmap_every_activation_kind_equals_its_plan || fail memmap_every_activation_kind_equals_its_plan "$(tail -2 $TMP/e.check) $(tail -2 $TMP/e.out)"
rm -rf $TMP/run
$UST train $TMP/c.yaml $S --set run.memory_limit_mb=1000 >$TMP/d.out 2>&1
rc=$?
[ $rc = 0 ] && [ ! -e $TMP/run/memory_map_rank_0.json ] && grep -q "^done: 2 steps" $TMP/d.out &&
    pass memmap_a_limit_that_fits_changes_nothing || fail memmap_a_limit_that_fits_changes_nothing "rc=$rc $(tail -2 $TMP/d.out)"
sed 's/^run:        {name: tiny,/run:        {name: tiny, memory_limit_mb: -5,/' $TMP/c.yaml >$TMP/bad.yaml
expect_exit memmap_negative_limit_exit_2 2 "bad.yaml:[0-9]+:[0-9]+: run.memory_limit_mb" -- $UST validate $TMP/bad.yaml
exit 0
