#!/bin/bash
# Issue #31's benchmark, in one command (as root, from anywhere):
#
#   benchmarks/regimes.sh
#
# On the emulated cluster (benchmarks/cluster.sh: HOSTS (default 2) hosts x PER_HOST (default 2)
# ranks), for every model in MODELS (default "resnet18 gpt"; also resnet50, and TensorFlow's
# ResNet-50 as tf-tape and tf-keras) and link rate in its RATES_<model> (chosen for r of about
# 0.1, 0.3, 1, 3 and 10 on a 2-core machine; each job measures and reports its r), one job of
# benchmarks/regimes.py (regimes_tf.py --api tape|keras for tf-*): the compute ceiling, Horovod
# fp32 and fp16 and every hvdcomp method with its defaults through the stock Horovod API, ROUNDS
# (default 3) rounds of STEPS (default 4) steps each, interleaved. Writes OUT (default
# results/regimes-<time>/): regimes.jsonl, regimes.md (per model and link: the fraction of the
# ceiling and the ratio to the faster of Horovod fp32 and fp16, and what the decision chose) and
# regimes.png (benchmarks/report.py --regimes). The cluster is removed on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster_job.sh"
MODELS=${MODELS:-"resnet18 gpt"}
# Rates for r of about 0.1, 0.3, 1, 3 and 10 with 224-pixel images (regimes.py says why 224;
# measured 2026-12-06: ResNet-18's r 0.48 at 1 Gbit/s, 1.01 at 500 Mbit/s, 3.05 at 160).
RATES_resnet18=${RATES_resnet18-"10gbit 2gbit 500mbit 160mbit 50mbit"}
# gpt at 8 sequences of 64 tokens per rank, r measured (2026-12-06): 0.33 at 3 Gbit/s, 1.08
# at 750 Mbit/s, 3.2 at 250, 6.2 at 120, 9.6 at 75 (that link, every method: over an hour,
# more than TIMEOUT's default allows).
RATES_gpt=${RATES_gpt-"3gbit 750mbit 250mbit 75mbit"}
# ResNet-50 at 224 pixels: r 0.68 at 500 Mbit/s (2026-12-06; a 5.4-s step); scaled for r of
# about 0.3, 1 and 3.
RATES_resnet50=${RATES_resnet50-"1gbit 340mbit 110mbit"}
# TensorFlow's ResNet-50 at 224 pixels: r 8.9 at 120 Mbit/s (tf-tape, 2026-12-06); 1 Gbit/s and
# 350 Mbit/s scaled from it (r of about 1 and 3; not run at 224 pixels).
RATES_tf_tape=${RATES_tf_tape-"1gbit 350mbit 120mbit"}
RATES_tf_keras=${RATES_tf_keras-"1gbit 350mbit 120mbit"}
# RATES_<model>= (set, empty) runs none of that model's links (only its "-big" row, if any).
# The lowest r: the fastest link with 4x (gpt: batch 32) the computation; labelled
# "<rate>-big". Set BIG_RATE= (empty) to skip it. (ResNet's 10 Gbit/s row is r 0.1 at 224 px.)
BIG_resnet18=${BIG_resnet18-}
BIG_gpt=${BIG_gpt-"--batch 32"}
BIG_RATE=${BIG_RATE-10gbit}
# gpt's configurations (30M parameters under AdamW) do not fit in memory together: one at a
# time, each beside the ceiling (regimes.py --sequential); 8 sequences of 64 tokens per rank
# (a 2.6 s CPU step for 4 ranks on 2 cores; one sequence, run until 2026-12-05, computed 8x
# less against the same codec work, as 64-pixel images did for the ResNets: regimes.py).
EXTRA_gpt=${EXTRA_gpt-"--sequential --batch 8"}
# TensorFlow's ResNet-50s with their traced graphs do not fit in memory together either.
EXTRA_tf_tape=${EXTRA_tf_tape-"--sequential"}
EXTRA_tf_keras=${EXTRA_tf_keras-"--sequential"}
# Warm-up steps at most while a method's decision still probes (45 left some probing in a
# ResNet-18 job at r 1: its rounds then timed the probe, not the choice).
MAX_WARMUP=${MAX_WARMUP:-90}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-4}
# Seconds each job may run. Measured: ResNet-18 at 50 Mbit/s, every method, 24 min; gpt with 8
# sequences at 120 Mbit/s, 4 configurations, 28 min (every method at 75 Mbit/s: more than an
# hour, estimated; a killed --sequential job keeps the pairs it finished).
TIMEOUT=${TIMEOUT:-3600}
OUT=${OUT:-$ROOT/results/regimes-$(date +%Y%m%d-%H%M%S)}
cluster_job 1gbit
for model in $MODELS; do
    var=${model//-/_}
    rates_var="RATES_$var" extra_var="EXTRA_$var" big_var="BIG_$var"
    case "$model" in
        tf-*) job=("$HERE/regimes_tf.py" --api "${model#tf-}") ;;
        *) job=("$HERE/regimes.py" --model "$model") ;;
    esac
    for rate in ${!rates_var}; do
        "$CLUSTER" rate "$rate"
        "$CLUSTER" run --per-host "$PER_HOST" --timeout "$TIMEOUT" -- "$PY" "${job[@]}" \
            --max-warmup "$MAX_WARMUP" ${!extra_var:-} ${METHODS:+--methods "ceiling,$METHODS"} \
            --rounds "$ROUNDS" \
            --steps "$STEPS" --label "$rate" --out "$OUT/regimes.jsonl" \
            || echo "${job[*]} at $rate failed (see above)"
    done
    if [ -n "${!big_var:-}" ] && [ -n "$BIG_RATE" ]; then
        "$CLUSTER" rate "$BIG_RATE"
        "$CLUSTER" run --per-host "$PER_HOST" --timeout "$TIMEOUT" -- "$PY" "${job[@]}" \
            --max-warmup "$MAX_WARMUP" ${!extra_var:-} ${!big_var} ${METHODS:+--methods "ceiling,$METHODS"} \
            --rounds "$ROUNDS" --steps "$STEPS" --label "$BIG_RATE-big" --out "$OUT/regimes.jsonl" \
            || echo "${job[*]} ${!big_var} at $BIG_RATE failed (see above)"
    fi
done
"$PY" "$HERE/report.py" --regimes "$OUT"
echo "results in $OUT"
