#!/bin/bash
set -u
C=/work/main/benchmarks/cluster.sh
PY=/work/main/.venv/bin/python
bash $C up 2 1gbit
for round in 1 2 3; do
  for m in none marsit topk efsignsgd; do
    echo "== $round $m"
    bash $C run --per-host 2 --timeout 300 -- env EPOCHS=20 OMP_NUM_THREADS=1 TF_USE_LEGACY_KERAS=1 \
      $PY /work/main/benchmarks/keras_steps.py "$m" 2>&1 | grep -E '^(none|marsit|topk|efsignsgd)|hvdcomp.decision' | grep -v WARNING | cut -c1-400
  done
done > /work/main/results/s75-d-default/d-default.txt 2>&1
bash $C down
echo done > /work/main/results/s75-d-default/finished
