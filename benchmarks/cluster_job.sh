# Sourced by the drivers of the emulated-cluster benchmarks (run_bench.sh, tf_vs_torch.sh,
# train_matrix.sh): the repository's paths (HERE, ROOT; the working directory becomes ROOT), the
# Python (PY: $PYTHON, default .venv/bin/python), the layout (HOSTS, default 2; PER_HOST,
# default 2), METHODS (default empty: every method), CLUSTER (cluster.sh) and its names, and
#   cluster_job FIRST_RATE
# which creates $OUT, removes a killed run's leftovers, brings the cluster up (HOSTS hosts, links
# at FIRST_RATE), records the machine's load and the cluster in $OUT/environment.txt, and removes
# the cluster on exit (also after a failure or Ctrl-C).
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
HOSTS=${HOSTS:-2}
PER_HOST=${PER_HOST:-2}
METHODS=${METHODS:-}  # default: hvd-fp32, hvd-fp16 and every method of hvdcomp/registry.py
CLUSTER="$HERE/cluster.sh"
export HVDC_PREFIX=${HVDC_PREFIX:-hvdc} HVDC_SUBNET=${HVDC_SUBNET:-10.77.0}

cluster_job() {
    mkdir -p "$OUT"
    trap '"$CLUSTER" down || true' EXIT
    trap 'exit 130' INT TERM
    "$CLUSTER" down >/dev/null 2>&1 || true
    "$CLUSTER" up "$HOSTS" "$1"
    { echo "# $(date -Is) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
      "$CLUSTER" status; } > "$OUT/environment.txt"
}
