"""Seeded per-element randomness for stochastic rounding, for NumPy arrays and Torch tensors.

``uniforms(key, n)`` returns ``n`` float32 numbers in [0, 1) on a grid of 2**-24. They depend only
on ``key`` (a tuple of non-negative integers, e.g. (seed, step, rank, stage)), like
``masks.bernoulli_mask``: the same key gives the same numbers on any machine or process, so a run
is reproducible and a resumed run (same seed and step counter) draws what the uninterrupted run
drew. For host data (NumPy, CPU tensors) they come from NumPy's PCG64 seeded by
``SeedSequence(key)``. For a device tensor ``like`` they are made on its device by a
counter-based hash (``device_uniforms``: element i is two rounds of MurmurHash3's 32-bit
finaliser of i under two words of ``SeedSequence(key)``), computed in exact integer arithmetic,
so the same on every GPU and run; a different stream from the host's, equally uniform. A rank
draws its own votes (keys hold the rank), so only runs that move the same tensors between host
and device see different draws.

``stochastic_signs(p, key)``: int8 ±1 with P(+1) = p element-wise, from ``uniforms``: ``+1``
where ``U < p``. With U on the 2**-24 grid, P(U < p) = ceil(p * 2**24) / 2**24, so the result is
unbiased up to that rounding of the probability (exact for p = 0, p = 1 and multiples of 2**-24).
"""
import numpy as np

from hvdcomp.backend.xp import from_host, is_torch, _torch


def uniforms(key, n, like=None):
    """``n`` uniform float32 numbers in [0, 1), keyed by ``key``; NumPy, or like ``like``."""
    if is_torch(like) and not like.is_cpu:
        return device_uniforms(key, n, like.device)
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))
    u = gen.random(int(n), dtype=np.float32)
    return from_host(u, like) if like is not None else u


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
    """``n`` float32 uniforms in [0, 1) on the 2**-24 grid, made on ``device`` from ``key``
    alone: ``fmix32(fmix32(i ^ w0) ^ w1) >> 8`` times 2**-24 for element i (< 2**32) and the
    first two 32-bit words of ``SeedSequence(key)``. Exact integer arithmetic: the same numbers
    on every device."""
    torch = _torch()
    w0, w1 = (int(w) for w in np.random.SeedSequence(list(key)).generate_state(2, np.uint32))
    h = torch.arange(int(n), dtype=torch.int64, device=device) & _MASK32
    h = _fmix32(_fmix32(h ^ w0) ^ w1)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))
