#!/usr/bin/env bash
# Build a Horovod wheel from its source release with hvdcomp's patches (scripts/horovod-patches/,
# each file says what it fixes), for the Python environment whose interpreter is $PYTHON_BIN:
#
#   PYTHON_BIN=.venv/bin/python bash scripts/build_horovod.sh horovod-0.28.1.tar.gz OUT_DIR
#
# scripts/setup.sh calls it (and caches the wheel); the GPU check (benchmarks/gpu_check.sh) calls
# it on a machine without package registries. Frameworks: PyTorch and TensorFlow with MPI unless
# the caller's environment says otherwise (e.g. HOROVOD_WITHOUT_TENSORFLOW=1). GPU operations only
# where HOROVOD_GPU_OPERATIONS asks, else HOROVOD_WITHOUT_GPU=1 (patch 03) unless the caller sets
# HOROVOD_WITHOUT_GPU=0 (Horovod's own rule: CUDA support where torch has CUDA and a toolkit is
# found, CUDA tensors staged through host memory for MPI). With HOROVOD_GPU_OPERATIONS=NCCL and no
# HOROVOD_NCCL_*, against the NCCL of torch's nvidia-nccl wheel (one NCCL, of one version, in the
# process). The build log goes to OUT_DIR/build.log.
set -euo pipefail
SDIST="$(realpath "$1")"
OUT="$(mkdir -p "$2" && realpath "$2")"
PYTHON_BIN="${PYTHON_BIN:?the Python of the environment Horovod is built for}"
# Absolute, but not resolved: a venv's python is a link out of the venv.
PYTHON_BIN="$(cd "$(dirname "$PYTHON_BIN")" && pwd)/$(basename "$PYTHON_BIN")"
PATCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/horovod-patches"
log() { echo "[build_horovod] $*" >&2; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK"
SRC="$(echo "$WORK"/horovod-*)"
for p in "$PATCH_DIR"/*.patch; do  # each fails the build if it does not apply cleanly
  if command -v patch >/dev/null; then patch -s -p1 -d "$SRC" <"$p"; else (cd "$SRC" && git apply -p1 "$p"); fi \
    || { log "patch $(basename "$p") does not apply"; exit 1; }
done

cd "$SRC"
export HOROVOD_WITH_MPI="${HOROVOD_WITH_MPI:-1}" HOROVOD_WITHOUT_MXNET=1 \
       PATH="$(dirname "$PYTHON_BIN"):$PATH" MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
       HOROVOD_BUILD_ARCH_FLAGS="${HOROVOD_BUILD_ARCH_FLAGS:--march=x86-64}" \
       CMAKE_POLICY_VERSION_MINIMUM=3.5 \
       CXXFLAGS="$(printf -- "-include %s " cstdint string stdexcept limits algorithm)${CXXFLAGS:-}"
# CMake 4 refuses the bundled Gloo's cmake_minimum_required (3.5 lets it configure). gcc >= 13's
# standard headers no longer include <cstdint>, <string>, <stdexcept> ... by the way, which
# Horovod's headers rely on (group_table.h: std::string, common.h: std::logic_error; upstream
# horovod #3957 adds such includes on master): every C++ file gets them.
[ "${HOROVOD_WITHOUT_PYTORCH:-}" = 1 ] || export HOROVOD_WITH_PYTORCH=1
[ "${HOROVOD_WITHOUT_TENSORFLOW:-}" = 1 ] || export HOROVOD_WITH_TENSORFLOW=1
[ -n "${HOROVOD_GPU_OPERATIONS:-}" ] || export HOROVOD_WITHOUT_GPU="${HOROVOD_WITHOUT_GPU:-1}"
if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}${HOROVOD_NCCL_LIB:-}" ]; then
  NCCL_H="$("$PYTHON_BIN" -c 'import glob, os, nvidia
print(next(iter(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "**", "include", "nccl.h"), recursive=True))), ""))' 2>/dev/null || true)"
  NCCL_DIR="$(dirname "$(dirname "${NCCL_H:-/x/x}")")"
  if [ -n "$NCCL_H" ] && [ -f "$NCCL_DIR/lib/libnccl.so.2" ]; then
    ln -sf libnccl.so.2 "$NCCL_DIR/lib/libnccl.so"  # the name CMake's find_library looks for
    export HOROVOD_NCCL_INCLUDE="$NCCL_DIR/include" HOROVOD_NCCL_LIB="$NCCL_DIR/lib" HOROVOD_NCCL_LINK=SHARED
    log "linking torch's NCCL $(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$NCCL_H" | paste -sd.) ($NCCL_DIR)"
  fi
fi
"$PYTHON_BIN" -m pip wheel --no-build-isolation --no-deps -w "$OUT" . >"$OUT/build.log" 2>&1 \
  || { tail -n 60 "$OUT/build.log" >&2; exit 1; }
ls "$OUT"/horovod-*.whl
