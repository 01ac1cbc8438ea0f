#!/usr/bin/env bash
# The flight recorder (parallel/comm/flight.h): a rank SIGSTOPped inside a 4-rank pipeline job
# makes the rank whose wait times out first gather every reachable rank's ring
# (run.out_dir/flight/rank_R.json) and print a diagnosis naming exactly the stopped rank and the
# message it never sent; `ustrain flight DIR` prints the same from the files afterwards. The files
# are JSON whose pending entries agree with the diagnosis. A SIGUSR2 storm and an unwritable
# flight directory leave training untouched (exit 0, the same losses).
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
PP="--set parallel.pp=4 --set train.global_batch_size=32 --set train.seq_len=32 --set data.val_every=100000"
C="--set train.steps=100000 --set checkpoint.every=0 --set dist.timeout_s=3 $PP"

# --- a stopped rank of a pp=4 job (rank 2: both its neighbours wait on it, rank 0 on rank 1)
# --fail-grace 5: ranks 0, 1 and 3 each reach their own 3 s deadline and write their ring; on a
# loaded machine (the suite beside other jobs) they trailed the first failure by over a second, so
# a grace of 1 s killed them before they wrote (only rank_0.json was there)
scripts/ustrun --nproc-per-node 4 --fail-grace 5 $UST train $TMP/c.yaml $C >$TMP/stop.out 2>&1 &
launcher=$!
for _ in $(seq 600); do [ "$(cat $TMP/run/metrics.jsonl 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
victim=
for p in $(pgrep -P $launcher); do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx RANK=2 && victim=$p; done
kill -STOP $victim
wait $launcher
kill -CONT $victim 2>/dev/null
D=$TMP/run/flight
grep -q "flight: diagnosis: the job waits on rank 2$" $TMP/stop.out &&
    [ "$(grep -c 'flight: diagnosis:' $TMP/stop.out)" = 1 ] &&
    pass flight_diagnosis_names_exactly_the_stopped_rank ||
    fail flight_diagnosis_names_exactly_the_stopped_rank "$(grep -E 'flight|hang' $TMP/stop.out | head -12)"
grep -q "flight: group 'pp': rank 2: no record (stopped, dead or unreachable)" $TMP/stop.out &&
    [ -f $D/rank_0.json ] && [ -f $D/rank_1.json ] && [ -f $D/rank_3.json ] && [ ! -f $D/rank_2.json ] &&
    pass flight_every_reachable_rank_wrote_its_ring ||
    fail flight_every_reachable_rank_wrote_its_ring "$(ls $D) $(grep 'rank 2:' $TMP/stop.out)"
# the message rank 1 waits for from rank 2, read from rank 1's file, is the one the diagnosis
# says rank 2 never sent; every file is JSON with its times in order
python3 - $D >$TMP/want.txt 2>$TMP/py.err <<'EOF'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/rank_*.json")):
    d = json.load(open(f))
    done = {g["id"]: g["done"] for g in d["groups"]}
    for x in d["entries"]:  # completed exactly up to the group's last completed op
        assert (x["state"] == "done") == (x["seq"] <= done[x["g"]]), (f, x, done[x["g"]])
        assert x["t_post"] > 0 and (x["t_wait"] == 0 or x["t_wait"] >= x["t_post"] - 1e-6), x
        assert (x["state"] == "done") == (x["t_done"] > 0), x
    if d["rank"] != 1: continue
    g = [g["id"] for g in d["groups"] if g["name"] == "pp"][0]
    pend = min((x for x in d["entries"] if x["g"] == g and x["state"] != "done"), key=lambda x: x["seq"])
    assert pend["state"] in ("waiting", "posted"), pend
    if pend["kind"] == "send_recv":  # the stop found it between two of its sends to rank 1
        msg = [m for p, how, m in pend["p2p"] if p == 2 and how == "recv"]
        print("rank 1 waits at send_recv op #%d (%s) since" % (pend["seq"], pend["label"]))
        print("behind: rank 2 (never reached the send #%d to rank 1)" % msg[0])
    else:  # ... or before a collective of the pipeline group (the loss sum, the step's figures)
        print("rank 1 waits at %s #%d (op #%d) since" % (pend["kind"], pend["coll"], pend["seq"]))
        print("behind: rank 2 (never reached %s #%d)" % (pend["kind"], pend["coll"]))
EOF
[ -s $TMP/want.txt ] && grep -qF "$(sed -n 1p $TMP/want.txt)" $TMP/stop.out &&
    grep "rank 1 waits at" $TMP/stop.out | grep -qF "$(sed -n 2p $TMP/want.txt)" &&
    pass flight_names_the_message_the_stopped_rank_never_sent ||
    fail flight_names_the_message_the_stopped_rank_never_sent "$(cat $TMP/want.txt $TMP/py.err | tail -3) / $(grep 'rank 1 waits' $TMP/stop.out)"
$UST flight $TMP/run >$TMP/after.out 2>&1
rc=$?
[ $rc = 0 ] && diff <(grep '^\[rank [0-9]\] flight: \(group\|diag\|job\)' $TMP/stop.out | sed 's/^\[rank [0-9]\] //; s/since [0-9.]* s/since S/') \
    <(sed 's/since [0-9.]* s/since S/' $TMP/after.out) >$TMP/after.diff &&
    pass flight_cli_prints_the_same_diagnosis_from_the_files ||
    fail flight_cli_prints_the_same_diagnosis_from_the_files "rc=$rc $(head -5 $TMP/after.diff)"
expect_exit flight_cli_without_files_exits_2 2 "holds no flight recorder file" -- $UST flight $TMP/data
expect_exit flight_cli_missing_dir_exits_2 2 "cannot read the directory $TMP/nowhere" -- $UST flight $TMP/nowhere

# --- SIGUSR2 storms: a single process and a pp job train on, with the losses of a quiet run
S="--set train.steps=12 --set checkpoint.every=0 --set logging.every=1"
storm() { # storm PID...: 300 SIGUSR2 to each, as fast as kill goes, until they end
    for _ in $(seq 300); do kill -USR2 "$@" 2>/dev/null || break; sleep 0.002; done
}
rm -rf $TMP/run
$UST train $TMP/c.yaml $S >$TMP/quiet.out 2>&1
grep -o "loss [0-9.]*" $TMP/quiet.out >$TMP/quiet.loss
rm -rf $TMP/run
$UST train $TMP/c.yaml $S >$TMP/storm.out 2>&1 &
pid=$!
for _ in $(seq 300); do [ -s $TMP/run/metrics.jsonl ] && break; sleep 0.05; done
storm $pid
wait $pid
rc=$?
[ $rc = 0 ] && diff -q $TMP/quiet.loss <(grep -o "loss [0-9.]*" $TMP/storm.out) >/dev/null &&
    python3 -c "import json,sys; json.load(open(sys.argv[1]))" $TMP/run/flight/rank_0.json &&
    pass flight_sigusr2_storm_writes_the_ring_and_training_goes_on ||
    fail flight_sigusr2_storm_writes_the_ring_and_training_goes_on "rc=$rc $(tail -3 $TMP/storm.out; ls $TMP/run/flight)"

# --- an unwritable flight directory (a file where it would be): one warning, the run finishes
rm -rf $TMP/run
mkdir -p $TMP/run
echo x >$TMP/run/flight
$UST train $TMP/c.yaml $S >$TMP/bad.out 2>&1 &
pid=$!
for _ in $(seq 300); do [ -s $TMP/run/metrics.jsonl ] && break; sleep 0.05; done
storm $pid
wait $pid
rc=$?
[ $rc = 0 ] && [ "$(grep -c 'warning: flight recorder: cannot write' $TMP/bad.out)" = 1 ] &&
    diff -q $TMP/quiet.loss <(grep -o "loss [0-9.]*" $TMP/bad.out) >/dev/null &&
    pass flight_unwritable_dir_warns_once_and_training_goes_on ||
    fail flight_unwritable_dir_warns_once_and_training_goes_on "rc=$rc $(grep -E 'warning|error' $TMP/bad.out | head -3)"
expect_exit flight_entries_negative_is_a_config_error 2 "logging.flight_entries" -- \
    $UST validate $TMP/c.yaml --set logging.flight_entries=-1
exit 0
