#!/usr/bin/env bash
# The whole test suite: set up (idempotent), then pytest. Every multi-rank test runs its MPI job
# under a hard timeout (tests/mpirun.py) and pytest-timeout bounds each test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
source "$ROOT/scripts/mpi_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider --timeout=600 --durations=20 tests benchmarks/tests "$@"
