#!/bin/bash
# A/B of the non-waiting scalar gather: old = ad6a85a, new = b2f12b3; 2 hosts x 2 ranks, 1 Gbit/s
set -u
C=/work/main/benchmarks/cluster.sh
PY=/work/main/.venv/bin/python
OUT=/tmp/s68/ab
bash $C up 2 1gbit
for round in 1 2 3; do
  for code in old new; do
    for m in "marsit@decision='compress'" "efsignsgd@decision='compress'"; do
      echo "== $round $code $m"
      bash $C run --per-host 2 --timeout 300 -- env PYTHONPATH=/tmp/s68/$code EPOCHS=4 STEPS_SHOWN=24 \
        OMP_NUM_THREADS=1 TF_USE_LEGACY_KERAS=1 $PY /tmp/s68/$code/benchmarks/keras_steps.py "$m" 2>&1 \
        | grep -E '^(marsit|efsignsgd)|median|steps' | grep -v WARNING
    done
  done
done > $OUT/keras-ab.txt 2>&1
for round in 1 2; do
  for code in old new; do
    echo "== $round $code resnet18 1gbit"
    bash $C run --per-host 2 --timeout 900 -- env PYTHONPATH=/tmp/s68/$code OMP_NUM_THREADS=1 \
      $PY /tmp/s68/$code/benchmarks/regimes.py --model resnet18 \
      --methods "ceiling,hvd-fp32,Marsit@decision=compress,EFSignSGD@decision=compress" \
      --rounds 3 --steps 4 --label "1gbit-$code-$round" --out $OUT/r18-ab.jsonl 2>&1 | tail -15
  done
done > $OUT/r18-ab.txt 2>&1
bash $C down
echo done > $OUT/finished
