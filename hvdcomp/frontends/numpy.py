"""NumPy adapter, for direct use of the compressors on host arrays (tests, TensorFlow's
numpy_function bridge)."""
import numpy as np

from hvdcomp.frontends import Identity

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def tensor_identity(tensor, depth=8):
    return Identity(None)


def describe_dtype(tensor):
    return str(np.asarray(tensor).dtype)


def is_supported(tensor):
    return np.asarray(tensor).dtype.type in FLOAT_DTYPES


def working(tensor, dtype):
    return np.asarray(tensor).reshape(-1).astype(dtype, copy=False)


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
