#!/usr/bin/env bash
# Set up everything hvdcomp needs on a Debian machine, idempotently:
#   - Open MPI from Debian (openmpi-bin, libopenmpi-dev)
#   - a virtual environment at .venv/ with the stack below, the test tools, and hvdcomp itself
#     (editable)
#   - Horovod 0.28.1 built from its source release with PyTorch, TensorFlow and MPI, with the
#     patches in scripts/horovod-patches/ (each file says what it fixes and which upstream issue it
#     addresses). The built wheel is cached outside the checkout in
#     ${HVDCOMP_CACHE:-$HOME/.cache/hvdcomp}, keyed by the exact versions and the patches, so the
#     second run is quick.
# A stamp file in .venv records what was installed; a second run with the same inputs does nothing.
# The installed stack (site-packages and scripts, hvdcomp's editable install left out) is kept in
# that cache too, as hard links (no copy: seconds, no disk), keyed by what the stamp records (the
# stack and the set-up's own files): a fresh clone on the same machine (CI) then links it into its
# new .venv in seconds, where pip takes minutes to unpack ~8 GB of wheels. Where hard links cannot
# be made (another file system), pip installs.
#
# Stacks (HVDCOMP_STACK):
#   current (default)  numpy 2.x, tensorflow-cpu 2.21.0 with tf-keras 2.21.0 (tf.keras is Keras 2
#                      where TF_USE_LEGACY_KERAS=1 is set: Horovod's Keras front end needs it),
#                      torch 2.14.1 (PyPI's Linux build, CUDA 13.0 inside; runs on the CPU),
#                      mpi4py 4, numba; Python 3.11, 3.12 or 3.13
#   2023               the earlier stack: numpy<2, tensorflow-cpu 2.15.1, torch 2.13.0 (CPU),
#                      mpi4py, numba; Python 3.11 only (TensorFlow 2.15 has no later wheels)
#
# Environment (all optional; the defaults give the set-up described above):
#   PYTHON            interpreter for the venv (default python3; 3.11-3.13, or 3.11 for the 2023 stack)
#   HVDCOMP_STACK     current (default) or 2023, see above
#   TORCH_SPEC        the torch requirement to install (default torch==<the stack's version>; the
#                     2023 stack's 2.13.0 resolves to the 2.13.0+cpu wheel where the package
#                     sources offer it, as on this project's machines and with the PyTorch CPU
#                     index below)
#   TORCH_INDEX_URL   an extra package index for that install, e.g. https://download.pytorch.org/whl/cpu
#                     or .../whl/cu126 (default: none, only pip's own configured sources)
#   HOROVOD_GPU_OPERATIONS, HOROVOD_NCCL_*, HOROVOD_CUDA_HOME ...  reach Horovod's build unchanged.
#                     With HOROVOD_GPU_OPERATIONS=NCCL and no HOROVOD_NCCL_*, Horovod is built
#                     against the NCCL of torch's own nvidia-nccl wheel (one NCCL in the process).
#                     Without HOROVOD_GPU_OPERATIONS the build has no GPU operations, also where
#                     torch was built with CUDA (HOROVOD_WITHOUT_GPU=1, a patch of ours).
# A non-default TORCH_SPEC, TORCH_INDEX_URL or HOROVOD_GPU_OPERATIONS gives the Horovod wheel its own
# cache key, so a CPU-only wheel is never reused for a GPU build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
HVDCOMP_STACK="${HVDCOMP_STACK:-current}"
case "$HVDCOMP_STACK" in
  current) TORCH_VERSION=2.14.1; TF_VERSION=2.21.0
           STACK_PINS=("numpy>=2,<3" "tf-keras==${TF_VERSION}" "mpi4py>=4") ;;
  2023)    TORCH_VERSION=2.13.0; TF_VERSION=2.15.1
           STACK_PINS=("numpy<2" "mpi4py") ;;
  *) echo "[setup] HVDCOMP_STACK=$HVDCOMP_STACK: expected current or 2023" >&2; exit 2 ;;
esac
HOROVOD_VERSION=0.28.1
PATCHES=("$ROOT"/scripts/horovod-patches/*.patch)
PATCH_HASH="$(cat "${PATCHES[@]}" "$ROOT/scripts/build_horovod.sh" | sha1sum | cut -c1-8)"
CACHE="${HVDCOMP_CACHE:-$HOME/.cache/hvdcomp}"
PYTAG="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
TORCH_SPEC="${TORCH_SPEC:-torch==${TORCH_VERSION}}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"
HVD_KEY="horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-tf${TF_VERSION}-${PYTAG}-p${PATCH_HASH}"
if [ "$TORCH_SPEC" != "torch==${TORCH_VERSION}" ] || [ -n "$TORCH_INDEX_URL" ] || [ -n "${HOROVOD_GPU_OPERATIONS:-}" ]; then
  # Readable part (the torch pin, the GPU operations) plus a hash of the exact inputs.
  VARIANT="$(printf '%s' "${TORCH_SPEC#torch==}" | tr -c 'A-Za-z0-9.+_-' '_')${HOROVOD_GPU_OPERATIONS:+-gpu${HOROVOD_GPU_OPERATIONS}}"
  VARIANT_HASH="$(printf '%s\n' "$TORCH_SPEC" "$TORCH_INDEX_URL" "${HOROVOD_GPU_OPERATIONS:-}" | sha1sum | cut -c1-8)"
  HVD_KEY="horovod-${HOROVOD_VERSION}-torch${VARIANT}-tf${TF_VERSION}-${PYTAG}-p${PATCH_HASH}-${VARIANT_HASH}"
fi
HVD_CACHE="$CACHE/$HVD_KEY"
STAMP="$VENV/.hvdcomp-setup-stamp"
SETUP_HASH="$(cat "$ROOT/setup.py" "$ROOT/scripts/setup.sh" | sha1sum | cut -c1-12)"  # by content
STAMP_WANT="$HVD_KEY $SETUP_HASH"

log() { echo "[setup] $*" >&2; }
TEMPLATE="$CACHE/venv-$SETUP_HASH-$HVD_KEY"  # keyed by what the stamp records
site_packages() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# The stack of a set-up with the same inputs, linked into a new .venv (returns 1 where it cannot;
# called as a condition, where set -e is off, so each step's failure is returned by hand).
restore_template() {
  [ -d "$TEMPLATE/site-packages" ] && [ ! -e "$VENV" ] || return 1
  "$PYTHON" -m venv --without-pip "$VENV" || return 1
  if ! cp -al "$TEMPLATE/site-packages/." "$(site_packages)/" 2>/dev/null; then
    rm -rf "$VENV"
    return 1
  fi
  local script
  for script in "$TEMPLATE"/bin/*; do  # entry points: their first line names the venv's python
    sed "1s|^#!.*python.*$|#!$VENV/bin/python|" "$script" > "$VENV/bin/$(basename "$script")" &&
      chmod +x "$VENV/bin/$(basename "$script")" || return 1
  done
  log "linked the installed stack from $TEMPLATE"
}

# This .venv's stack, as hard links, for restore_template (one per stack kept: the earlier
# set-up's of this stack go).
save_template() {
  [ ! -d "$TEMPLATE" ] || return 0
  local tmp="$TEMPLATE.tmp.$$" old script
  rm -rf "$CACHE"/venv-*-"$HVD_KEY".tmp.*  # left by an interrupted set-up
  mkdir -p "$tmp/bin"
  if ! cp -al "$(site_packages)" "$tmp/site-packages" 2>/dev/null; then
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$tmp"/site-packages/__editable__*hvdcomp* "$tmp"/site-packages/hvdcomp-*.dist-info
  for script in "$VENV"/bin/*; do
    case "$(basename "$script")" in python*|activate*|Activate.ps1) continue ;; esac
    [ -f "$script" ] && [ ! -L "$script" ] && cp -p "$script" "$tmp/bin/"
  done
  for old in "$CACHE"/venv-*-"$HVD_KEY"; do [ "$old" = "$tmp" ] || rm -rf "$old"; done
  mv "$tmp" "$TEMPLATE"
}

# 1. Open MPI (system packages).
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicxx >/dev/null 2>&1; then
  log "installing Open MPI from Debian"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  apt_log="$(mktemp)"  # apt's and debconf's lines are shown only if the install fails
  if ! { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq openmpi-bin libopenmpi-dev; } >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    rm -f "$apt_log"
    exit 1
  fi
  rm -f "$apt_log"
fi

# The fused kernels, compiled ahead into numba's disk cache (~10 s once; ~1 s to load them when
# the cache is current), so that no training job compiles them.
warm_kernels() {
  "$VENV/bin/python" -c 'from hvdcomp import kernels, registry
for m in sorted({"finite", *(m for c in registry.METHODS.values() for m in c.Method.kernel_modules)}):
    kernels.warm(m)'
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_WANT" ] && "$VENV/bin/python" -c 'import horovod.torch, horovod.tensorflow, mpi4py, numba, hvdcomp' 2>/dev/null; then
  warm_kernels
  log "already set up ($HVD_KEY)"
  exit 0
fi

PIP=(pip_quiet install -q)
# pip, without the warnings about this machine's file:// indexes; a synchronous filter, so that an
# error message is printed before set -e ends the script (pipefail keeps pip's exit status).
pip_quiet() { { "$VENV/bin/python" -m pip "$@" 2>&1 1>&3 3>&- | { grep -v "is ignored: it is neither" || true; } >&2; } 3>&1; }

install_stack() {  # steps 2 and 3
  # 2. The virtual environment and the Python stack.
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  TORCH_PIP_ARGS=()
  [ -z "$TORCH_INDEX_URL" ] || TORCH_PIP_ARGS=(--extra-index-url "$TORCH_INDEX_URL")
  log "installing ${TORCH_SPEC}${TORCH_INDEX_URL:+ (extra index ${TORCH_INDEX_URL})}, tensorflow-cpu ${TF_VERSION}, ${STACK_PINS[*]}, test tools"
  "${PIP[@]}" "${TORCH_PIP_ARGS[@]}" "$TORCH_SPEC" "tensorflow-cpu==${TF_VERSION}" "${STACK_PINS[@]}" \
    numba cloudpickle psutil pyyaml packaging cffi "pytest>=7" pytest-timeout scikit-learn matplotlib wheel setuptools "cmake>=3.13,<4"

  # 3. Horovod, from its source release, through the wheel cache.
  WHEEL="$(ls "$HVD_CACHE"/horovod-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    log "building Horovod ${HOROVOD_VERSION} (several minutes, cached in $HVD_CACHE)"
    BUILD="$(mktemp -d)"
    trap 'rm -rf "$BUILD"' EXIT
    pip_quiet download -q --no-deps --no-binary :all: "horovod==${HOROVOD_VERSION}" -d "$BUILD"
    PYTHON_BIN="$VENV/bin/python" bash "$ROOT/scripts/build_horovod.sh" \
      "$BUILD/horovod-${HOROVOD_VERSION}.tar.gz" "$BUILD/wheel" >/dev/null
    mkdir -p "$HVD_CACHE"
    cp "$BUILD"/wheel/horovod-*.whl "$HVD_CACHE/"
    WHEEL="$(ls "$HVD_CACHE"/horovod-*.whl | head -n1)"
  fi
  log "installing $(basename "$WHEEL")"
  "${PIP[@]}" --no-deps --force-reinstall "$WHEEL"
  "${PIP[@]}" cloudpickle psutil pyyaml packaging cffi  # Horovod's runtime dependencies
}
restore_template || install_stack

# 4. hvdcomp itself, editable.
"${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT"

# The stack imports; TensorFlow's start-up lines (absl, oneDNN, CUDA stubs) shown only on failure.
if ! out="$("$VENV/bin/python" -c 'import horovod.torch, horovod.tensorflow, mpi4py, numba, hvdcomp' 2>&1)"; then
  echo "$out" >&2
  exit 1
fi
warm_kernels
log "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
echo "$STAMP_WANT" > "$STAMP"
save_template
log "done"
