"""Finiteness of a host buffer read in place by its address (numba), for the many small tensors
that Horovod sums itself (``hvdcomp.engine.Entry.by_horovod``).

``all_finite_at(address, count, itemsize)``: True when none of the ``count`` float32
(``itemsize`` 4) or float64 (8) elements stored contiguously from ``address`` is NaN or +-Inf.
It reads the exponent bits of each element (all ones: NaN or Inf), so a large finite value never
counts as non-finite and nothing is computed in floating point. Nothing is allocated.

Why by address: such a tensor is checked in ``compress`` (Horovod then reduces it in place), one
call per tensor per step, and on a model of a thousand tensors every microsecond of that call
shows in the step; a NumPy view and a dot product cost ~10 us per tensor inside the training
step, this call ~1 us. The caller guarantees the address (e.g. a CPU tensor's ``data_ptr()``) and
that the ``count`` elements lie end to end.
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from hvdcomp.kernels import JIT_OPTIONS as _JIT

_EXPONENT32, _EXPONENT64 = np.uint32(0x7F800000), np.uint64(0x7FF0000000000000)


def _pointer_to(bits):
    @intrinsic
    def at(typingctx, address):
        """The ``uint<bits>*`` at integer ``address``."""
        sig = types.CPointer(getattr(types, f"uint{bits}"))(types.intp)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
        return sig, codegen
    return at


_words32, _words64 = _pointer_to(32), _pointer_to(64)


@numba.njit(inline="always", **_JIT)
def _no_exponent_all_ones(words, exponent):
    bad = False
    for i in range(words.shape[0]):
        bad |= (words[i] & exponent) == exponent
    return not bad


@numba.njit(**_JIT)
def _finite32(address, count):
    return _no_exponent_all_ones(numba.carray(_words32(address), (count,)), _EXPONENT32)


@numba.njit(**_JIT)
def _finite64(address, count):
    return _no_exponent_all_ones(numba.carray(_words64(address), (count,)), _EXPONENT64)


def all_finite_at(address, count, itemsize):
    """See the module docstring."""
    if itemsize == 4:
        return _finite32(address, count)
    if itemsize == 8:
        return _finite64(address, count)
    raise ValueError(f"all_finite_at: float32 or float64 elements only (itemsize {itemsize})")


def warm(dtype):
    """Compile (or load from the cache) both widths (``hvdcomp.kernels.warm``; ``dtype`` is
    not needed: float32 trainings sum float64 tensors too)."""
    for width in (np.float32, np.float64):
        x = np.ones(16, width)
        all_finite_at(x.ctypes.data, x.size, x.itemsize)
