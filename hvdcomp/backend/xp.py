"""The few array operations the backend needs, for NumPy arrays and Torch tensors alike.

The kernels are written once against these helpers; a helper picks NumPy or Torch from the type
of its first argument. Torch is imported lazily, so a NumPy-only (or TensorFlow-only) user never
needs it.
"""
import math

import numpy as np


def is_torch(x):
    """True if ``x`` is a torch.Tensor (without importing torch when it is not loaded)."""
    mod = type(x).__module__
    return mod.startswith("torch")


def _torch():
    import torch
    return torch


_VIEWABLE = []


def numpy_viewable():
    """The torch dtypes a CPU tensor of which NumPy views without a copy (not bfloat16)."""
    if not _VIEWABLE:
        torch = _torch()
        _VIEWABLE.extend((torch.float16, torch.float32, torch.float64))
    return _VIEWABLE


def to_host(x):
    """A NumPy view/copy of ``x`` in host memory (a device tensor is copied to the host)."""
    if is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def from_host(a, like):
    """``a`` (NumPy, or a tensor already) as the same kind of array as ``like``, on ``like``'s
    device (no copy where it is there already)."""
    if is_torch(like):
        if is_torch(a):
            return a.to(like.device)
        torch = _torch()
        return torch.from_numpy(np.ascontiguousarray(a)).to(like.device)
    return a


def concat(arrays, like):
    """Concatenate 1-D arrays; ``like`` tells the kind when ``arrays`` is empty. A single
    array is returned as it is (no copy)."""
    if len(arrays) == 1:
        return arrays[0]
    if is_torch(like):
        torch = _torch()
        if not arrays:
            return torch.zeros(0, dtype=like.dtype, device=like.device)
        return torch.cat(list(arrays))
    if not arrays:
        return np.zeros(0, dtype=like.dtype)
    return np.concatenate(list(arrays))


def joined(arrays, like):
    """``concat(arrays, like)``, but when the arrays are host arrays that already lie end to end
    in one buffer (consecutive C-contiguous 1-D pieces of one base, e.g. state written into
    slices of an earlier joined vector), a view of that span instead of a copy. Only for arrays
    the caller may write through (the view aliases them)."""
    if len(arrays) > 1 and all(isinstance(a, np.ndarray) and a.ndim == 1
                               and a.flags.c_contiguous for a in arrays):
        base, dtype = arrays[0].base, arrays[0].dtype
        start = arrays[0].__array_interface__["data"][0]
        at = start
        for a in arrays:
            if a.base is not base or base is None or a.dtype != dtype \
                    or a.__array_interface__["data"][0] != at:
                break
            at += a.nbytes
        else:
            if isinstance(base, np.ndarray) and base.ndim == 1 and base.dtype == dtype \
                    and base.flags.c_contiguous:
                first = (start - base.__array_interface__["data"][0]) // dtype.itemsize
                return base[first:first + (at - start) // dtype.itemsize]
    return concat(arrays, like)


def add(a, b, out):
    """``out = a + b`` (elementwise, same kind, shape and dtype); returns ``out``."""
    if is_torch(out):
        return _torch().add(a, b, out=out)
    return np.add(a, b, out=out)


def abs_sum(x):
    """sum(|x|) as a Python float (pairwise summation in ``x``'s dtype)."""
    if is_torch(x):
        return float(x.abs().sum())
    return float(np.abs(x).sum())


def finite_and_zero(x):
    """``(finite, zero)``: whether no element of ``x`` is NaN or +-Inf, and whether every element
    is zero, from the same cheap pass as ``all_finite`` (a sum of squares of 0 is confirmed
    element by element, since squares of tiny values underflow)."""
    if is_torch(x):
        if not (x.is_cpu and x.dtype in numpy_viewable()):
            torch = _torch()
            quick = float((x.float() * x.float()).sum()) if x.numel() else 0.0
            if quick == 0.0:
                return True, not bool(x.any())
            return math.isfinite(quick) or bool(torch.isfinite(x).all()), False
        x = x.detach().numpy() if x.requires_grad else x.numpy()
    flat = x.reshape(-1)
    quick = flat.dot(flat) if flat.dtype.itemsize >= 4 else flat.sum()
    if quick == 0:
        return True, not flat.any()
    return math.isfinite(quick) or bool(np.isfinite(flat).all()), False


def all_finite(x):
    """True if no element of ``x`` is NaN or +-Inf. One cheap pass (a finite sum of squares, or
    sum for half precision, means finite elements); only a non-finite one, possibly an overflow
    of large finite values, is checked element by element. A CPU tensor is checked through a
    NumPy view (a fraction of Torch's per-call cost on the many small tensors of a model)."""
    if is_torch(x):
        if not (x.is_cpu and x.dtype in numpy_viewable()):
            torch = _torch()
            return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())
        x = x.detach().numpy() if x.requires_grad else x.numpy()
    flat = x.reshape(-1)
    quick = flat.dot(flat) if flat.dtype.itemsize >= 4 else flat.sum()
    return math.isfinite(quick) or bool(np.isfinite(flat).all())


def sqrt(x, out=None):
    """Element-wise square root (into ``out``, which may be ``x``; else a fresh array)."""
    if is_torch(x):
        return _torch().sqrt(x, out=out)
    return np.sqrt(x, out=out)


def multiply(a, b, out=None):
    """``a * b`` (``b`` an array like ``a`` or a Python scalar) into ``out`` (else a fresh
    array); returns it."""
    if is_torch(a):
        return _torch().mul(a, b, out=out)
    return np.multiply(a, b, out=out)


def clip_(x, bound):
    """``x`` clipped to ``[-bound, bound]`` in place; returns ``x``."""
    if is_torch(x):
        return x.clamp_(-bound, bound)
    return np.clip(x, -bound, bound, out=x)


def divide(a, b, out):
    """``out = a / b`` (elementwise, same kind, shape and dtype); returns ``out``."""
    if is_torch(a):
        return _torch().div(a, b, out=out)
    return np.divide(a, b, out=out)


def zeros_like(x):
    """Zeros like ``x``. For NumPy, ``empty_like`` + ``fill``: NumPy backs large ``empty``
    allocations with transparent huge pages, while ``zeros`` (calloc) faults in 4 KB pages,
    about 7x slower to first touch (100 MB: ~100 ms against ~14 ms here)."""
    if is_torch(x):
        return _torch().zeros_like(x)
    out = np.empty_like(x)
    out.fill(0)
    return out


def empty_like(x, n=None):
    """An uninitialised array like ``x`` (kind, dtype, device), of ``x``'s shape or ``n``
    elements."""
    if is_torch(x):
        torch = _torch()
        return torch.empty_like(x) if n is None else torch.empty(n, dtype=x.dtype,
                                                                 device=x.device)
    return np.empty_like(x) if n is None else np.empty(n, dtype=x.dtype)


def spread(values, indices, out):
    """A sparse vector made dense in ``out`` (either kind): ``values`` at ``indices`` (both of
    ``out``'s kind), 0 elsewhere. Returns ``out``."""
    out[...] = 0
    out[indices] = values
    return out


def searchsorted(sorted_values, points):
    """Host int64 positions where ``points`` (host ints) would go in ``sorted_values`` (1-D,
    ascending, of either kind: a device tensor is searched on its device), left side."""
    if is_torch(sorted_values):
        torch = _torch()
        where = torch.as_tensor(np.asarray(points), device=sorted_values.device)
        return to_host(torch.searchsorted(sorted_values, where.to(sorted_values.dtype)))
    return np.searchsorted(sorted_values, points)


_SIGN_BIT = {2: (np.uint16, 1 << 15), 4: (np.uint32, 1 << 31), 8: (np.uint64, 1 << 63)}


def _copysign_scalar(value, x, out):
    """``out = copysign(value, x)`` (``value`` >= 0): the IEEE sign bit of each ``x[i]`` (so
    -0.0 gives -value) with the magnitude ``value``. NumPy's own ``copysign`` is not vectorised
    (about 2.4x a memory copy); two integer passes on the bit patterns are."""
    if is_torch(x):
        torch = _torch()
        return torch.copysign(torch.tensor(value, dtype=out.dtype, device=out.device), x, out=out)
    uint, sign = _SIGN_BIT[out.dtype.itemsize]
    bits = out.view(uint)
    np.bitwise_and(x.view(uint), uint(sign), out=bits)
    np.bitwise_or(bits, np.array(abs(value), dtype=out.dtype).view(uint), out=bits)
    return out


def signed_constant(x, value, out):
    """``out[i] = +value`` where ``x[i]``'s sign bit is clear, ``-value`` where it is set (-0.0
    included: the sign ``pack_signs`` encodes). ``out`` has ``x``'s shape, dtype and kind and is
    returned; ``value`` >= 0. No allocation."""
    return _copysign_scalar(value, x, out)


def set_magnitude(x, value):
    """``x[i] = copysign(value, x[i])`` in place (exact: every element becomes +-value)."""
    return _copysign_scalar(value, x, x)
