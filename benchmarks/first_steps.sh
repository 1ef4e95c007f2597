#!/bin/bash
# What a user sees first, in one command (as root, from anywhere):
#
#   RATES="1gbit" benchmarks/first_steps.sh
#
# On the emulated cluster (HOSTS x PER_HOST ranks, cluster_job.sh), for every link rate in RATES
# (default 1gbit) and every configuration in METHODS (default Horovod fp32 and fp16, Marsit,
# TopK, BinSGDM, SketchFusion), ROUNDS (default 1) jobs of benchmarks/first_steps.py (one
# configuration per job: a fresh process, as a user's first run), MODEL (default mlp, the 25M
# 2-layer MLP), STEPS (default 60) steps. Writes OUT (default results/first-steps-<time>/):
# first_steps.jsonl and first_steps.md (the medians of steps 2-6 and 51-60, and their ratios
# to Horovod fp32's and fp16's of the same round).
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
"$PY" - "$OUT/first_steps.jsonl" <<'PY' | tee "$OUT/first_steps.md"
import collections, json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["label"], r["round"])][r["method"]] = r
print("| link | method | steps 2-6 (s) | steps 51-60 (s) | 2-6 / 51-60 | 2-6 vs fp32 | "
      "2-6 vs fp16 | 51-60 vs fp32 | not run |")
print("|---|---|---|---|---|---|---|---|---|")
for (label, rnd), runs in sorted(by.items()):
    base32, base16 = runs.get("hvd-fp32"), runs.get("hvd-fp16")
    for m, r in runs.items():
        ratio = lambda b, k: f"{b[k] / r[k]:.2f}x" if b and r.get(k) else "-"
        print(f"| {label} (round {rnd}) | {m} | {r['first']:.3f} | {r['steady'] or 0:.3f} | "
              f"{r['first'] / r['steady'] if r['steady'] else 0:.2f} | {ratio(base32, 'first')} | "
              f"{ratio(base16, 'first')} | {ratio(base32, 'steady')} | "
              f"{', '.join(r.get('not_run') or []) or '-'} |")
PY
echo "results in $OUT"
