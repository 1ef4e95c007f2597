#!/bin/bash
# What a user sees first, in one command (as root, from anywhere):
#
#   RATES="1gbit" benchmarks/first_steps.sh
#
# On the emulated cluster (HOSTS x PER_HOST ranks, cluster_job.sh), for every link rate in RATES
# (default 1gbit) and every configuration in METHODS (default Horovod fp32 and fp16, Marsit,
# TopK, BinSGDM, SketchFusion), ROUNDS (default 1) jobs of benchmarks/first_steps.py (one
# configuration per job: a fresh process, as a user's first run), MODEL (default mlp, the 25M
# 2-layer MLP; resnet18: Horovod's synthetic benchmark's), STEPS (default 60) steps. Writes OUT
# (default results/first-steps-<time>/): first_steps.jsonl and first_steps.md (the medians of
# steps 2-6 and 51-60, the mean of 11-14, and their ratios to Horovod fp32's and fp16's of the
# same round).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster_job.sh"
RATES=${RATES:-1gbit}
METHODS=${METHODS:-hvd-fp32,hvd-fp16,Marsit,TopK,BinSGDM,SketchFusion}
MODEL=${MODEL:-mlp}
STEPS=${STEPS:-60}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-$ROOT/results/first-steps-$(date +%Y%m%d-%H%M%S)}
cluster_job "${RATES%% *}"
for rate in $RATES; do
    "$CLUSTER" rate "$rate"
    for ((round = 1; round <= ROUNDS; round++)); do
        for method in ${METHODS//,/ }; do
            "$CLUSTER" run --timeout 900 -- "$PY" \
                "$HERE/first_steps.py" --model "$MODEL" --method "$method" --steps "$STEPS" \
                --label "$rate" --round "$round" --out "$OUT/first_steps.jsonl" \
                2>&1 | grep -v '^\[' | tail -2 || echo "first_steps.py $method at $rate failed"
        done
    done
done
"$PY" "$HERE/first_steps_report.py" "$OUT/first_steps.jsonl" | tee "$OUT/first_steps.md"
echo "results in $OUT"
