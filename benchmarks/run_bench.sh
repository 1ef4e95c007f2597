#!/bin/bash
# The compression benchmark on an emulated cluster, in one command (as root, from anywhere):
#
#   benchmarks/run_bench.sh
#
# Brings up HOSTS (default 2) network-namespace hosts (benchmarks/cluster.sh), and for every link
# rate in RATES (default "100mbit 1gbit 10gbit") re-shapes the links, measures one TCP stream
# between two hosts (benchmarks/netprobe.py) and runs benchmarks/allreduce_bench.py on
# HOSTS x PER_HOST ranks (default 2) over SIZES (default 1M,5M,25M elements) with REPS (default 3)
# timed calls after one warm-up (GRAD_COLUMNS: each gradient a matrix of that many columns, as
# PowerSGD needs to compress it; default a vector). Then writes, under results/bench-<time>/
# (also results/latest): raw.jsonl, train.jsonl (per-step training time of a transformer, benchmarks/train_step_bench.py;
# TRAIN=0 skips it), netprobe.jsonl, table.md, results.csv, allreduce.png (benchmarks/report.py) and
# cost_model.md (benchmarks/cost_model.py), and prints the table. The cluster is removed on exit,
# also after a failure or Ctrl-C. About 10-15 minutes on a 2-core machine with the defaults.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster_job.sh"
RATES=${RATES:-"100mbit 1gbit 10gbit"}
SIZES=${SIZES:-1M,5M,25M}
REPS=${REPS:-3}
JOB_TIMEOUT=${JOB_TIMEOUT:-900}
OUT=${OUT:-$ROOT/results/bench-$(date +%Y%m%d-%H%M%S)}
cluster_job "${RATES%% *}"

for rate in $RATES; do
    "$CLUSTER" rate "$rate"
    port=$((5900 + RANDOM % 90))
    timeout 60 "$CLUSTER" exec 1 "$PY" "$HERE/netprobe.py" server "$port" &
    probe=$(timeout 60 "$CLUSTER" exec 0 "$PY" "$HERE/netprobe.py" client "$HVDC_SUBNET.11" "$port" 3 \
        2>/dev/null || true)
    wait || true
    echo "netprobe $rate: ${probe:-failed}"
    if [ -n "$probe" ]; then
        echo "$probe" | "$PY" -c "import json,sys; d=json.load(sys.stdin); d['label']='$rate'; print(json.dumps(d))" \
            >> "$OUT/netprobe.jsonl"
        measured=$(echo "$probe" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['mbit_per_s']*1e6)")
    else
        measured=0
    fi
    rate_bps=$("$PY" -c "
s='$rate'.lower()
for suf,m in (('gbit',1e9),('mbit',1e6),('kbit',1e3)):
    if s.endswith(suf): print(float(s[:-len(suf)])*m); break")
    "$CLUSTER" run --per-host "$PER_HOST" --timeout "$JOB_TIMEOUT" -- \
        "$PY" "$HERE/allreduce_bench.py" --sizes "$SIZES" ${METHODS:+--methods "$METHODS"} --reps "$REPS" \
        ${GRAD_COLUMNS:+--columns "$GRAD_COLUMNS"} \
        --max-seconds 45 --label "$rate" --rate-bps "$rate_bps" --measured-bps "$measured" \
        --out "$OUT/raw.jsonl"
    if [ "${TRAIN:-1}" = 1 ]; then
        "$CLUSTER" run --per-host "$PER_HOST" --timeout "$JOB_TIMEOUT" -- \
            "$PY" "$HERE/train_step_bench.py" ${METHODS:+--methods "$METHODS"} --label "$rate" \
            --out "$OUT/train.jsonl" || echo "train-step bench at $rate failed (see above)"
    fi
done

"$PY" "$HERE/report.py" "$OUT"
"$PY" "$HERE/cost_model.py" "$OUT/raw.jsonl" | tee "$OUT/cost_model.md"
ln -sfn "$(basename "$OUT")" "$ROOT/results/latest"
echo "results in $OUT"
