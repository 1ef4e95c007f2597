#!/usr/bin/env bash
# A user's AdamW recipe under every compression (issue 30): examples/train_charlm.py with
# torch.optim.AdamW(lr=3e-3, weight_decay=0.01), 300 steps, 4 ranks, seeds 0/1/2, the same rate
# for every compression (nothing but compression= changes). Prints each run's summary line.
# METHODS="none marsit" SEEDS="0" narrow it; JSON curves go to $OUT (default results/adamw).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/mpi_env.sh"
OUT="${OUT:-$ROOT/results/adamw}"
mkdir -p "$OUT"
for seed in ${SEEDS:-0 1 2}; do
  for c in ${METHODS:-none marsit topk sketchfusion efsignsgd}; do
    timeout 400 mpirun -np 4 --oversubscribe --bind-to none "$ROOT/.venv/bin/python" \
      "$ROOT/examples/train_charlm.py" --compression "$c" --seed "$seed" --optimizer adamw \
      --lr 3e-3 --steps 300 --eval-every 50 --json "$OUT/$c-$seed.json" | grep "done:"
  done
done
