"""Seeded per-element randomness for stochastic rounding, for NumPy arrays and Torch tensors.

``uniforms(key, n)`` returns ``n`` float32 numbers in [0, 1) on a grid of 2**-24. They depend only
on ``key`` (a tuple of non-negative integers, e.g. (seed, step, rank, stage)), like
``masks.bernoulli_mask``: the same key gives the same numbers on any machine, process or device,
so a run is reproducible and a resumed run (same seed and step counter) draws what the
uninterrupted run drew. Element i is a counter-based hash (no generator state):

    w0, w1 = SeedSequence(key).generate_state(2, uint32)
    U_i    = (fmix32(fmix32(i ^ w0) ^ w1) >> 8) * 2**-24        (i < 2**32; i mod 2**32 beyond)

with ``fmix32`` MurmurHash3's 32-bit finaliser (an invertible mix of all 32 bits). The host
computes it in NumPy's uint32 arithmetic (``host_uniforms``), a device tensor ``like`` on its
device in int64 arithmetic (``device_uniforms``), and the fused BinSGDM kernels
(``hvdcomp.methods.binsgdm.kernels``) inline, element by element: the same numbers everywhere. Being a
function of (key, i), element i of a stream is drawn without drawing the ones before it.

``stochastic_signs(p, key)``: int8 ±1 with P(+1) = p element-wise, from ``uniforms``: ``+1``
where ``U < p``. With U on the 2**-24 grid, P(U < p) = ceil(p * 2**24) / 2**24, so the result is
unbiased up to that rounding of the probability (exact for p = 0, p = 1 and multiples of 2**-24).
"""
import numpy as np

from hvdcomp.backend.xp import from_host, is_torch, _torch


def words(key):
    """The two 32-bit words of ``key`` the hash mixes in (module docstring), as Python ints."""
    return tuple(int(w) for w in np.random.SeedSequence(list(key)).generate_state(2, np.uint32))


def uniforms(key, n, like=None):
    """``n`` uniform float32 numbers in [0, 1), keyed by ``key``; NumPy, or like ``like``."""
    if is_torch(like) and not like.is_cpu:
        return device_uniforms(key, n, like.device)
    u = host_uniforms(key, n)
    return from_host(u, like) if like is not None else u


def _host_fmix32(h):
    """MurmurHash3's fmix32 on a uint32 array, in place (NumPy's uint32 products wrap)."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def host_uniforms(key, n):
    """``uniforms(key, n)`` on the host (NumPy float32), the reference of the other paths."""
    w0, w1 = words(key)
    h = np.arange(int(n), dtype=np.uint64).astype(np.uint32)
    h ^= np.uint32(w0)
    h = _host_fmix32(h)
    h ^= np.uint32(w1)
    h = _host_fmix32(h)
    h >>= np.uint32(8)
    u = h.astype(np.float32)
    u *= np.float32(1.0 / (1 << 24))
    return u


def stochastic_signs(p, key):
    """int8 ±1, same kind/device/length as the 1-D float array ``p``: +1 with probability p."""
    n = p.numel() if is_torch(p) else np.asarray(p).size
    u = uniforms(key, n, like=p)
    if is_torch(p):
        torch = _torch()
        return torch.where(u < p, 1, -1).to(torch.int8)
    return np.where(u < np.asarray(p), np.int8(1), np.int8(-1))


_MASK32 = 0xFFFFFFFF


def _mul32(h, c):
    """``(h * c) mod 2**32`` for an int64 tensor ``h`` of values below 2**32 and a 32-bit
    constant ``c``, without int64 overflow (two products of at most 48 bits)."""
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _MASK32


def _fmix32(h):
    """MurmurHash3's 32-bit finaliser (an invertible mix of all 32 bits), int64 tensors."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def device_uniforms(key, n, device):
    """``uniforms(key, n)`` made on ``device`` (a float32 tensor there): the module's hash in
    exact int64 arithmetic, the host's numbers."""
    torch = _torch()
    w0, w1 = words(key)
    h = torch.arange(int(n), dtype=torch.int64, device=device) & _MASK32
    h = _fmix32(_fmix32(h ^ w0) ^ w1)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))
