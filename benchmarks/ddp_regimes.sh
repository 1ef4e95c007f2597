#!/bin/bash
# PyTorch DDP's benchmark, in one command (as root, from anywhere):
#
#   benchmarks/ddp_regimes.sh
#
# On the emulated cluster (benchmarks/cluster.sh: HOSTS (default 2) hosts x PER_HOST (default 2)
# ranks, one torchrun agent per host in its namespace, Gloo over the shaped links), for every
# model in MODELS (default "resnet18") and link rate in its RATES_<model> (ResNet-18: r of about
# 0.3 and 3 on a 2-core machine, as regimes.sh's; each job measures and reports its r), one job of
# benchmarks/ddp_regimes.py: the compute ceiling, DDP's all-reduce and fp16 hook, PyTorch's
# PowerSGD hook (rank 1 and 4) and the hvdcomp hooks of METHODS (a comma list, default all),
# ROUNDS (default 3) rounds of STEPS (default 3) steps each, interleaved. Writes OUT (default
# results/ddp-regimes-<time>/): regimes.jsonl, each host's log and regimes.md (ddp_report.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster_job.sh"
MODELS=${MODELS:-"resnet18"}
RATES_resnet18=${RATES_resnet18-"2gbit 160mbit"}
RATES_gpt=${RATES_gpt-"750mbit 250mbit"}
EXTRA_gpt=${EXTRA_gpt-"--sequential --batch 8"}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}
MAX_WARMUP=${MAX_WARMUP:-45}
TIMEOUT=${TIMEOUT:-3600}
OUT=${OUT:-$ROOT/results/ddp-regimes-$(date +%Y%m%d-%H%M%S)}
cluster_job 1gbit
IPS=($(awk '{print $1}' "/run/hvdc-$HVDC_PREFIX/hosts"))
for model in $MODELS; do
    rates_var="RATES_$model" extra_var="EXTRA_$model"
    for rate in ${!rates_var}; do
        "$CLUSTER" rate "$rate"
        port=$((29500 + RANDOM % 1000))
        for ((h = 0; h < HOSTS; h++)); do
            env OMP_NUM_THREADS=1 PYTHONPATH="$ROOT" GLOO_SOCKET_IFNAME=cl0 PYTHONUNBUFFERED=1 \
                timeout -k 15 "$TIMEOUT" "$CLUSTER" exec "$h" "$(dirname "$PY")/torchrun" \
                --nnodes="$HOSTS" --nproc-per-node="$PER_HOST" --node-rank="$h" \
                --master-addr="${IPS[0]}" --master-port="$port" \
                "$HERE/ddp_regimes.py" --model "$model" --max-warmup "$MAX_WARMUP" \
                ${!extra_var:-} ${METHODS:+--methods "ceiling,ddp,ddp-fp16,powersgd-1,powersgd-4,$METHODS"} --rounds "$ROUNDS" \
                --steps "$STEPS" --label "$rate" --out "$OUT/regimes.jsonl" \
                > "$OUT/$model-$rate-host$h.log" 2>&1 &
        done
        wait || echo "ddp_regimes.py $model at $rate failed (see $OUT/$model-$rate-host*.log)"
        grep -h 'ms/step' "$OUT/$model-$rate-host0.log" || true
    done
done
"$PY" "$HERE/ddp_report.py" "$OUT/regimes.jsonl" | tee "$OUT/regimes.md"
echo "results in $OUT"
