"""Seeded per-element randomness for stochastic rounding, for NumPy arrays and Torch tensors.

``uniforms(key, n)`` returns ``n`` float32 numbers in [0, 1) on a grid of 2**-24. They depend only
on ``key`` (a tuple of non-negative integers, e.g. (seed, step, rank, stage)), like
``masks.bernoulli_mask``: the same key gives the same numbers on any machine or process, so a run
is reproducible and a resumed run (same seed and step counter) draws what the uninterrupted run
drew. They are generated on the host (NumPy PCG64 seeded by ``SeedSequence(key)``) and copied to
``like``'s device when ``like`` is a device tensor.

``stochastic_signs(p, key)``: int8 ±1 with P(+1) = p element-wise, from ``uniforms``: ``+1``
where ``U < p``. With U on the 2**-24 grid, P(U < p) = ceil(p * 2**24) / 2**24, so the result is
unbiased up to that rounding of the probability (exact for p = 0, p = 1 and multiples of 2**-24).
"""
import numpy as np

from hvdcomp.backend.xp import from_host, is_torch, _torch


def uniforms(key, n, like=None):
    """``n`` uniform float32 numbers in [0, 1), keyed by ``key``; NumPy, or like ``like``."""
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
