#!/bin/bash
# TensorFlow beside PyTorch (issue #19), in one command (as root, from anywhere):
#
#   benchmarks/tf_vs_torch.sh
#
# On the emulated cluster (benchmarks/cluster.sh: HOSTS (default 2) hosts x PER_HOST (default 2)
# ranks), for every link rate in RATES (default "1gbit 100mbit"): the per-step training time of
# the same models through the stock Horovod APIs, every method of METHODS (default: Horovod fp32,
# fp16 and every hvdcomp method) in one job per (framework, API, model), so every ratio compares
# figures of one run:
#   PyTorch hvd.DistributedOptimizer (train_step_bench.py), TensorFlow DistributedGradientTape in a
#   tf.function and Keras model.fit (tf_step_bench.py), for the models of MODELS (default
#   "mlp48 mlp": the 48-tensor 25M MLP and the 2-layer 25M MLP); Keras for mlp48 only, and at
#   100mbit only the mlp48 PyTorch/tf.function pair (SLOW_RATES_ALL=1: everything).
# Writes OUT (default results/tf-vs-torch-<time>/): train.jsonl, tf_vs_torch.md (the table:
# ms/step, speedup over Horovod fp32 and fp16 of the same job, TF/PyTorch step ratio) and
# tf_vs_torch.png (benchmarks/report.py --tf-vs-torch). About 25 minutes on a 2-core machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster_job.sh"
RATES=${RATES:-"1gbit 100mbit"}
MODELS=${MODELS:-"mlp48 mlp"}
STEPS=${STEPS:-3}
OUT=${OUT:-$ROOT/results/tf-vs-torch-$(date +%Y%m%d-%H%M%S)}
cluster_job "${RATES%% *}"
job() {  # job RATE SCRIPT ARGS...: one job on the cluster; a failed job is reported, the rest go on
    local rate=$1 script=$2; shift 2
    "$CLUSTER" run --per-host "$PER_HOST" --timeout 1200 -- "$PY" "$HERE/$script" \
        ${METHODS:+--methods "$METHODS"} --warmup 2 --steps "$STEPS" --label "$rate" --out "$OUT/train.jsonl" "$@" \
        || echo "$script $* at $rate failed (see above)"
}
for rate in $RATES; do
    "$CLUSTER" rate "$rate"
    for model in $MODELS; do
        if [ "$rate" != "${RATES%% *}" ] && [ "$model" != mlp48 ] && [ "${SLOW_RATES_ALL:-0}" != 1 ]; then
            continue
        fi
        job "$rate" train_step_bench.py --model "$model"
        job "$rate" tf_step_bench.py --model "$model" --api tape
        if [ "$model" = mlp48 ] && { [ "$rate" = "${RATES%% *}" ] || [ "${SLOW_RATES_ALL:-0}" = 1 ]; }; then
            job "$rate" tf_step_bench.py --model "$model" --api keras
        fi
    done
done
"$PY" "$HERE/report.py" --tf-vs-torch "$OUT"
echo "results in $OUT"
