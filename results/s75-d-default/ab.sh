#!/bin/bash
# A/B of TensorFlow's closing take (session 74's fix): old = f64c715 (before), new = d024619;
# recipe (d) with each method's defaults, 2 hosts x 2 ranks at 1 Gbit/s, 3 rounds interleaved.
set -u
C=/work/main/benchmarks/cluster.sh
PY=/work/main/.venv/bin/python
OUT=/work/main/results/s75-d-default
bash $C up 2 1gbit
for round in 1 2 3; do
  for run in "old none" "old marsit" "new marsit" "old topk" "new topk"; do
    set -- $run; code=$1 m=$2
    echo "== $round $code $m"
    bash $C run --per-host 2 --timeout 300 -- env PYTHONPATH=/tmp/s75ab/$code EPOCHS=20 \
      OMP_NUM_THREADS=1 TF_USE_LEGACY_KERAS=1 $PY /tmp/s75ab/$code/benchmarks/keras_steps.py "$m" 2>&1 \
      | grep -E '^(none|marsit|topk)|hvdcomp.decision' | grep -v WARNING | cut -c1-400
  done
done > $OUT/ab.txt 2>&1
bash $C down
echo done > $OUT/ab-finished
