#!/usr/bin/env bash
# The checks for a GPU machine (run there through the device tool; its image has CUDA, PyTorch,
# Open MPI and mpi4py but no Horovod and no package registries):
#   1. Horovod 0.28.1 built there from its source release (the sdist, carried) with hvdcomp's
#      patches (scripts/build_horovod.sh): PyTorch + MPI, with CUDA (CUDA tensors staged through
#      host memory for MPI, so several ranks can share one GPU), kernels for COMPUTE_CAPABILITY;
#   2. tests/test_cuda.py: the device kernels against the host's, every method on CUDA gradients
#      on 2 ranks, and every method through the stock hvd.DistributedOptimizer on CUDA;
#   3. benchmarks/cuda_step_bench.py on 2 ranks.
# Logs and the wheel's build log go to $OUT (or /tmp/gpu_check).
#   bash benchmarks/gpu_check.sh .hvdsrc/horovod-0.28.1.tar.gz
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SDIST="${1:?the Horovod source release (horovod-0.28.1.tar.gz)}"
LOGS="${OUT:-/tmp/gpu_check}"
mkdir -p "$LOGS"
cd "$ROOT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export HVDCOMP_DECISION=compress
nvidia-smi -L; mpirun --version | head -1; command -v mpicxx
python3 -c 'import torch, numpy, numba, mpi4py; print("torch", torch.__version__, "numpy", numpy.__version__, "numba", numba.__version__, "mpi4py", mpi4py.__version__)'
# Horovod's setup_requires (cffi) where no package index is reachable: wheels carried in .whl/.
[ -d .whl ] && python3 -m pip install -q --no-deps --no-index .whl/*.whl
start=$(date +%s)
HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_GPU=0 HOROVOD_BUILD_CUDA_CC_LIST="${COMPUTE_CAPABILITY:-90}" \
  PYTHON_BIN="$(command -v python3)" bash scripts/build_horovod.sh "$SDIST" /tmp/hvd_wheel \
  || { cp /tmp/hvd_wheel/build.log "$LOGS/" 2>/dev/null; exit 1; }
echo "Horovod built in $(( $(date +%s) - start )) s"
python3 -m pip install -q --no-deps --no-index /tmp/hvd_wheel/horovod-*.whl
python3 -c 'import horovod, horovod.torch as hvd; print("horovod", horovod.__version__, "cuda_built", hvd.cuda_built(), "mpi_built", hvd.mpi_built())'
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tee "$LOGS/cuda_tests.log"
timeout 150 mpirun -np 2 --oversubscribe --bind-to none python3 benchmarks/cuda_step_bench.py 2>&1 \
  | tee "$LOGS/cuda_step_bench.log"
