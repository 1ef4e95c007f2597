#!/bin/bash
# Issue #18's training-step matrix, in one command (as root, from anywhere):
#
#   benchmarks/train_matrix.sh
#
# On the emulated cluster (benchmarks/cluster.sh: HOSTS (default 2) hosts x PER_HOST (default 2)
# ranks), for every link rate in RATES (default "100mbit 1gbit 10gbit") and model in MODELS
# (default "mlp mlp48 transformer": the 25M 2-layer MLP, the 25M MLP of 48 tensors, the 17.7M
# transformer LM), one job of benchmarks/train_step_bench.py: every method of METHODS (default:
# Horovod fp32, fp16 and every hvdcomp method) through the stock hvd.DistributedOptimizer, WARMUP
# (default 2) then STEPS (default 3) timed steps each, so every ratio compares figures of one job.
# Writes OUT (default results/train-matrix-<time>/): train.jsonl, train_matrix.md (a summary of
# speedups, then per (model, link) the step time, first step, hvdcomp's encode / comm / decode /
# rest, bytes sent, x fp32, x fp16) and train_matrix.png (benchmarks/report.py --train).
# About 25 minutes on a 2-core machine. The cluster is removed on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster_job.sh"
RATES=${RATES:-"100mbit 1gbit 10gbit"}
MODELS=${MODELS:-"mlp mlp48 transformer"}
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-3}
OUT=${OUT:-$ROOT/results/train-matrix-$(date +%Y%m%d-%H%M%S)}
cluster_job "${RATES%% *}"
for rate in $RATES; do
    "$CLUSTER" rate "$rate"
    for model in $MODELS; do
        "$CLUSTER" run --per-host "$PER_HOST" --timeout 1200 -- "$PY" "$HERE/train_step_bench.py" \
            --model "$model" ${METHODS:+--methods "$METHODS"} --warmup "$WARMUP" --steps "$STEPS" \
            --max-seconds 90 --label "$rate" --out "$OUT/train.jsonl" \
            || echo "train_step_bench.py --model $model at $rate failed (see above)"
    done
done
"$PY" "$HERE/report.py" --train "$OUT"
echo "results in $OUT"
