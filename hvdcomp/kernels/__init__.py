"""Fused, compiled CPU kernels (numba): when they load, the switch between them and the NumPy
reference path, and the kernels several methods share (``topk``, ``simd``, ``finite``); a method's
own kernels live in its folder (``hvdcomp.methods.<name>.kernels``), named by their module path.

What is fused (each kernel reads and writes every full-size array once; contracts in the
modules' docstrings):
- ``hvdcomp.signs.kernels.encode``: compensation ``p = g + e``, the l1 sum ``sum |p|`` and the
  packed sign bits (``hvdcomp.backend.bits`` layout), one pass (Marsit and EF-signSGD);
- ``hvdcomp.signs.kernels.marsit_decode``: unpacking the merged bits, the step ``delta * b`` and
  Marsit's memory update, one pass; ``hvdcomp.signs.kernels.vote_decode``: the same for
  EF-signSGD (majority vote of all ranks' bits, step, own error);
- ``hvdcomp.kernels.topk.SumSource``: TopK's compensation ``a = g + e`` fused with the
  threshold scan of the selection (``hvdcomp.backend.topk``), one pass;
- ``hvdcomp.methods.binsgdm.kernels``: BinSGDM's moments, direction and stochastic vote (its uniforms
  computed inline), one pass; the re-binarisation packed as drawn; the nodes' totals from their
  bits; the mean vote;
- ``hvdcomp.methods.sketchfusion.kernels``: SketchFusion's table, every row filled in one pass over the
  input; the estimate of every position, the median over the sketch's rows taken as it is read,
  one pass;
- ``hvdcomp.kernels.finite``: whether a small float32/float64 host buffer is finite, read in place
  by its address (the check of every tensor Horovod sums for hvdcomp, once per tensor per step;
  in ``ALWAYS``: used whenever numba is installed, as it replaces no reference computation).

When they are loaded: where compressing pays (``hvdcomp.engine.KernelLoading``: the decision
holds or tries in earnest a choice that compresses, or numba is loaded already), so that a job
that passes every gradient never pays numba's import (~1 s per process); ``active(module, ...)``
serves a module's kernels once it is loaded, the reference path (the same bits) until then.

They apply to host (NumPy) arrays only: contiguous 1-D float32 or float64 (CPU torch tensors
reach the methods as NumPy views). Torch tensors on a device keep the ``hvdcomp.backend`` path.

Every kernel gives the same bits as the NumPy reference path it replaces: the same packed
bytes, the same selected indices and values, and memories and steps equal bit for bit (the same
float operations in the same order; the l1 sum reproduces NumPy's own summation order, see
``hvdcomp.signs.kernels``). So ranks running either path stay bit-identical, and a resume
replays the same numbers.

The switch: environment variable ``HVDCOMP_KERNELS`` (read at every call):
- ``numba`` (the default when numba is installed): the fused kernels;
- ``numpy``: the NumPy reference path everywhere (what the kernels are tested against).
Without numba installed the reference path runs (``HVDCOMP_KERNELS=numba`` then raises).
The kernels are compiled on first use and cached on disk (numba's ``cache=True``, in
``__pycache__`` beside this package, or numba's user cache directory where that is read-only),
so later processes load them instead of compiling.

Nothing here knows about Horovod, MPI, a framework or the state store.
"""
import importlib.util
import os
import sys

import numpy as np

ENV = "HVDCOMP_KERNELS"
# numba.njit options of every kernel: compiled once and cached on disk, the GIL released, and
# NumPy's error model: a float division by zero gives inf/nan as NumPy's does (numba's default,
# Python's, raises, and its check keeps LLVM from vectorising a loop that divides: BinSGDM's
# moments ran 2.7x slower with it)
JIT_OPTIONS = dict(cache=True, nogil=True, error_model="numpy")
MODES = ("numba", "numpy")
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# Kernels that replace no NumPy reference path (nothing to compare bit for bit): they serve
# whenever numba is installed, whatever ``HVDCOMP_KERNELS`` says.
ALWAYS = ("finite",)

_HAVE_NUMBA = None


def installed():
    """True when numba is installed."""
    global _HAVE_NUMBA
    if _HAVE_NUMBA is None:
        _HAVE_NUMBA = importlib.util.find_spec("numba") is not None
    return _HAVE_NUMBA


def mode():
    """'numba' or 'numpy': the path selected by ``HVDCOMP_KERNELS`` (module docstring)."""
    want = os.environ.get(ENV, "").strip().lower()
    if want not in ("",) + MODES:
        raise ValueError(f"{ENV} must be one of {MODES}, got {want!r}")
    if want == "numba" and not installed():
        raise ImportError(f"{ENV}=numba, but numba is not installed (pip install numba)")
    return want or ("numba" if installed() else "numpy")


def active(module, *arrays):
    """True when the fused kernels of ``module`` serve these arrays: the kernels are selected,
    ``module``'s are loaded (``warm``: until then the reference path runs, the same bits), and
    every array is a C-contiguous 1-D NumPy float32/float64 array (``None`` entries are skipped)
    of one dtype."""
    arrays = [a for a in arrays if a is not None]
    if not arrays or not on(module):
        return False
    dtype = arrays[0].dtype if isinstance(arrays[0], np.ndarray) else None
    return all(isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype == dtype
               and a.flags.c_contiguous for a in arrays) and dtype in FLOATS


_WARMED = set()


def warm(module):
    """Load now, from numba's disk cache (or compile, when it is empty), every specialisation of
    the kernels of ``module`` (a kernels module's dotted path, such as
    ``'hvdcomp.signs.kernels'``, or the name of one in this package: 'topk', 'finite') that a float32
    training uses (the first step, without memory, and the later ones, with it), so that the
    steps that use them do not pay for it. Called by the step engine for the kernels of its
    method (``Method.kernel_modules``) and 'finite' (``hvdcomp.engine.KernelLoading``: where
    compressing pays), and by BinSGDM's constructor (its moments use them on every step); once
    per module and process; nothing on the reference path (except the ``ALWAYS`` kernels).
    ``active`` serves a module's kernels from then on."""
    if module in _WARMED or not (mode() == "numba" or (module in ALWAYS and installed())):
        return
    path = module if "." in module else f"{__name__}.{module}"
    importlib.import_module(path).warm(np.float32)
    _WARMED.add(module)


def ready(module):
    """Whether ``module``'s kernels are loaded in this process (``warm`` ran for it)."""
    return module in _WARMED


def on(module):
    """Whether ``module``'s kernels serve host arrays now: selected (``mode``) and loaded."""
    return module in _WARMED and mode() == "numba"


def numba_loaded():
    """Whether numba is imported in this process already (loading a kernel then costs that
    kernel only, not numba's import and target initialisation: ~1 s per process)."""
    return "numba" in sys.modules
