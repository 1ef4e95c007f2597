"""NumPy adapter, for direct use of the compressors on host arrays (tests, benchmarks, and
TensorFlow's numpy_function bridge, which calls ``reduce_batch_now(keys, ...)`` with its own keys).

No Horovod call stands above a direct ``compress()``, so a host array is named explicitly::

    ph, ctx = comp.compress(named(grad, "layer1.weight"))
"""
import numpy as np

from hvdcomp.backend import xp
from hvdcomp.facade.frontends.identity import Identity
from hvdcomp.facade.frontends.naming import unnamed

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


class NamedArray(np.ndarray):
    """A NumPy array carrying ``hvdcomp_name``, the name its compressor state is kept under."""
    hvdcomp_name = None

    def __array_finalize__(self, obj):
        self.hvdcomp_name = getattr(obj, "hvdcomp_name", None)


def named(array, name):
    """``array`` (no copy) named ``name`` for ``compress()``: the same name on every rank, one
    per tensor, and the same at every step."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    out = np.asarray(array).view(NamedArray)
    out.hvdcomp_name = name
    return out


def tensor_identity(tensor, method):
    """``Identity(name)`` of an array made by ``named()``; ``UnnamedTensorError`` otherwise."""
    name = getattr(tensor, "hvdcomp_name", None)
    if not isinstance(name, str):
        a = np.asarray(tensor)
        raise unnamed(method, a.shape, a.dtype, advice=(
            "Name a host array explicitly: "
            "comp.compress(hvdcomp.facade.frontends.numpy.named(array, 'w'))"))
    return Identity(name)


def describe_dtype(tensor):
    return str(np.asarray(tensor).dtype)


def is_supported(tensor):
    return np.asarray(tensor).dtype.type in FLOAT_DTYPES


def all_finite(tensor):
    """Whether no element of ``tensor`` is NaN or +-Inf (the check of an array that Horovod's
    allreduce sums, ``hvdcomp.engine.Entry.by_horovod``: TensorFlow's passed gradients)."""
    return xp.all_finite(np.asarray(tensor))


def working(tensor, dtype):
    return np.asarray(tensor).reshape(-1).astype(dtype, copy=False)


def result_target(tensor, identity):
    """None: a host array's result is always a new array (``compress`` is out of place)."""
    return None


def placeholder(tensor, values):
    """The placeholder: no allreduce runs on host arrays, so decompress() gets it back as it is
    and reads it as op=Average."""
    return np.asarray(values[:1], dtype=np.float32)


def reduced(output):
    return np.asarray(output, dtype=np.float64).reshape(-1).tolist()


def restore(flat, like_shape, like_dtype, like_device):
    return np.asarray(flat).reshape(like_shape).astype(like_dtype, copy=False)


def meta(tensor):
    a = np.asarray(tensor)
    return a.shape, a.dtype, None
