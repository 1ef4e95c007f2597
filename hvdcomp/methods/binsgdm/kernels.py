"""Fused BinSGDM kernels (numba) on host arrays: the moments, the direction and the stochastic
vote in one pass (the moments and the direction alone, for its step aside); the inter-node
re-binarisation packed as it is drawn; the nodes' vote totals from their packed bits; the mean
vote.

Every kernel gives the numbers of the NumPy reference path of ``hvdcomp.methods.binsgdm.math`` bit
for bit: the same float32 operations in the same order (no fused multiply-add; numba contracts
nothing without fastmath), the same comparisons (``U < p`` in float32 for votes, in float64 for the
re-binarisation; both as exact integer comparisons of the 24-bit draw), and the uniforms of
``hvdcomp.methods.binsgdm.stochastic`` computed inline from the element's position (a counter hash: no
generator state, no n-sized array of random numbers).

Arrays: 1-D and C-contiguous; ``g``, ``m``, ``v`` and their outputs one float dtype (float32 or
float64); votes a signed integer dtype; packed bits uint8 in ``hvdcomp.backend.bits``'s layout.
Outputs go to the buffers the caller gives.
"""
import numba
import numpy as np

from hvdcomp.methods.binsgdm.math import LANES
from hvdcomp.kernels import JIT_OPTIONS as _JIT
from hvdcomp.signs.kernels import VOTE_BLOCK, count_bits

_SCALE = np.float32(1 << 24)


@numba.njit(inline="always", **_JIT)
def _fmix32(h):
    """MurmurHash3's fmix32 in wrapping uint32 arithmetic (LLVM vectorises it)."""
    h = np.uint32(h ^ (h >> np.uint32(16)))
    h = np.uint32(h * np.uint32(0x85EBCA6B))
    h = np.uint32(h ^ (h >> np.uint32(13)))
    h = np.uint32(h * np.uint32(0xC2B2AE35))
    return np.uint32(h ^ (h >> np.uint32(16)))


@numba.njit(inline="always", **_JIT)
def _draw(i, w0, w1):
    """Element ``i``'s 24-bit draw ``k`` of the stream with words ``w0``, ``w1`` (uint32): its
    uniform is ``k * 2**-24``."""
    return _fmix32(np.uint32(_fmix32(np.uint32(np.uint32(i) ^ w0)) ^ w1)) >> np.uint32(8)


PROBABILITY_BLOCK = 16384  # elements per block of moments_votes (their probabilities stay in L2)


@numba.njit(inline="always", **_JIT)
def _moments(gi, m, v, i, b1, omb1, b2, omb2, one):
    """Element ``i``'s new ``(m, v)`` from its gradient ``gi`` (``m``, ``v`` None: the first
    step, ``g`` and ``|g|``), the reference's float operations."""
    if m is None:
        return gi * one, abs(gi)
    return m[i] * b1 + gi * omb1, v[i] * b2 + abs(gi) * omb2


@numba.njit(inline="always", **_JIT)
def _direction(mi, vi, eps, one):
    """``u = clip(m / (v + eps), -1, 1)``, the reference's float operations."""
    u = mi / (vi + eps)
    u = one if u > one else u
    return -one if u < -one else u


@numba.njit(inline="always", **_JIT)
def _probability(mi, vi, eps, one, half):
    """``p = (clip(m / (v + eps), -1, 1) + 1) / 2``, the reference's float operations."""
    return (_direction(mi, vi, eps, one) + one) * half


@numba.njit(inline="always", **_JIT)
def _moments_probabilities(g, m, v, b1, omb1, b2, omb2, eps, one, half, m_out, v_out, p):
    """The new moments of a block and its vote probabilities (one loop LLVM vectorises)."""
    for i in range(g.shape[0]):
        mi, vi = _moments(g[i], m, v, i, b1, omb1, b2, omb2, one)
        m_out[i] = mi
        v_out[i] = vi
        p[i] = _probability(mi, vi, eps, one, half)


@numba.njit(inline="always", **_JIT)
def _add_to_lanes(x, start, lanes):
    """Adds ``x[j]`` (in float64) to ``lanes[(start + j) % LANES]``, in order: the lanes of
    ``hvdcomp.methods.binsgdm.math.total`` for a slice of an array that starts at element
    ``start``. The whole groups of ``LANES`` go in a loop LLVM vectorises."""
    n = x.shape[0]
    head = min((LANES - start % LANES) % LANES, n)
    for j in range(head):
        lanes[(start + j) % LANES] += np.float64(x[j])
    body = head + (n - head) // LANES * LANES
    for lo in range(head, body, LANES):
        for lane in range(LANES):
            lanes[lane] += np.float64(x[lo + lane])
    for j in range(body, n):
        lanes[(start + j) % LANES] += np.float64(x[j])


@numba.njit(inline="always", **_JIT)
def _lanes_total(lanes):
    out = 0.0
    for lane in range(LANES):
        out += lanes[lane]
    return out


@numba.njit(**_JIT)
def moments_votes(g, m, v, b1, omb1, b2, omb2, eps, w0, w1, offset, m_out, v_out, p, votes,
                  lanes):
    """BinSGDM's encode of one tensor: ``m_out, v_out`` = the new moments (``m``, ``v`` None:
    the first step, ``g`` and ``|g|``), ``u = clip(m / (v + eps), -1, 1)``, ``p = (u + 1) / 2``
    and ``votes[offset + i] = +1 if U[offset + i] < p[i] else -1``; returns the sum of the new
    ``v`` (``hvdcomp.methods.binsgdm.math.total``; ``lanes``: a float64 work buffer of
    ``LANES``). ``p`` is a work buffer of any length >= 1: the elements go in blocks of
    ``len(p)``, each in two loops (the moments and probabilities, then the draws), each of which
    LLVM vectorises (as one loop neither is: 2x slower); a block's probabilities (and new ``v``,
    summed) stay in cache (``PROBABILITY_BLOCK``) instead of making a round trip through memory.
    Every loop indexes zero-based slices (no negative-index
    checks). The scalars are the reference's float32 constants (``omb1 = 1 - b1`` rounded,
    ...); ``w0``, ``w1`` the stream's words (uint32). ``U < p`` is tested as
    ``k < p * 2**24`` (exact: a power-of-two scaling of both sides)."""
    one, half = g.dtype.type(1.0), g.dtype.type(0.5)
    n, block = g.shape[0], p.shape[0]
    lanes[:] = 0.0
    for lo in range(0, n, block):
        k = min(block, n - lo)
        gb, mo, vo, pb = g[lo:lo + k], m_out[lo:lo + k], v_out[lo:lo + k], p[:k]
        if m is None:
            _moments_probabilities(gb, None, None, b1, omb1, b2, omb2, eps, one, half, mo, vo, pb)
        else:
            _moments_probabilities(gb, m[lo:lo + k], v[lo:lo + k], b1, omb1, b2, omb2, eps, one,
                                   half, mo, vo, pb)
        _add_to_lanes(vo, lo, lanes)
        vts = votes[offset + lo:offset + lo + k]
        for i in range(k):
            d = np.float32(_draw(offset + lo + i, w0, w1))
            vts[i] = np.int8(1) if d < pb[i] * _SCALE else np.int8(-1)
    return _lanes_total(lanes)


@numba.njit(inline="always", **_JIT)
def _moments_direction(g, m, v, b1, omb1, b2, omb2, eps, one, m_out, v_out, u_out):
    for i in range(g.shape[0]):
        mi, vi = _moments(g[i], m, v, i, b1, omb1, b2, omb2, one)
        m_out[i] = mi
        v_out[i] = vi
        u_out[i] = _direction(mi, vi, eps, one)


@numba.njit(**_JIT)
def moments_direction(g, m, v, b1, omb1, b2, omb2, eps, m_out, v_out, u_out, lanes):
    """BinSGDM's step aside (``hvdcomp.stepaside``) for one tensor: ``m_out, v_out`` = the new
    moments (``m``, ``v`` None: the first step) and ``u_out = clip(m / (v + eps), -1, 1)``, the
    reference's float operations (``moments_votes``' without the draws); returns the sum of the
    new ``v`` as ``moments_votes`` does, in blocks of ``PROBABILITY_BLOCK`` summed while in
    cache."""
    one = g.dtype.type(1.0)
    n = g.shape[0]
    lanes[:] = 0.0
    for lo in range(0, n, PROBABILITY_BLOCK):
        k = min(PROBABILITY_BLOCK, n - lo)
        mo, vo, uo = m_out[lo:lo + k], v_out[lo:lo + k], u_out[lo:lo + k]
        if m is None:
            _moments_direction(g[lo:lo + k], None, None, b1, omb1, b2, omb2, eps, one, mo, vo, uo)
        else:
            _moments_direction(g[lo:lo + k], m[lo:lo + k], v[lo:lo + k], b1, omb1, b2, omb2, eps,
                               one, mo, vo, uo)
        _add_to_lanes(vo, lo, lanes)
    return _lanes_total(lanes)


def rebinarise_thresholds(node_size):
    """For each node sum s in [-L, L] (index s + L): the least 24-bit draw that votes -1,
    ``ceil(p * 2**24)`` with ``p = (s + L) / (2 L)`` in float64 as the reference computes it, so
    that ``k < threshold`` exactly when ``k * 2**-24 < p`` (both sides scaled by 2**24, exact)."""
    s = np.arange(-node_size, node_size + 1, dtype=np.float64)
    return np.ceil((s + node_size) / (2.0 * node_size) * (1 << 24)).astype(np.int64)


@numba.njit(**_JIT)
def rebinarise_packed(node_sum, node_size, thresholds, w0, w1, packed):
    """A node's re-binarised sum, packed: bit i is 1 (vote +1) when ``U[i] < (s_i + L) / (2 L)``
    (``L = node_size``; ``thresholds`` from ``rebinarise_thresholds(L)``); unused bits of the
    last byte 0. A byte at a time (its 8 draws, then one store)."""
    n = node_sum.shape[0]
    for j in range((n + 7) // 8):
        byte = 0
        for b in range(min(8, n - 8 * j)):
            i = 8 * j + b
            vote = np.int64(_draw(i, w0, w1)) < thresholds[np.int64(node_sum[i]) + node_size]
            byte |= np.int64(vote) << (7 - b)
        packed[j] = byte


@numba.njit(**_JIT)
def node_totals(messages, n, node_size, out):
    """``out[i] = node_size * sum over rows of (+1 if bit i set else -1)`` for the (nodes,
    nbytes) uint8 ``messages``: the estimate of the sum over all ranks."""
    nodes = messages.shape[0]
    ones = np.empty(VOTE_BLOCK, np.int32)
    for lo in range(0, n, VOTE_BLOCK):  # a multiple of 8: element lo + k is bit k & 7
        m = min(VOTE_BLOCK, n - lo)
        count = ones[:m]
        count_bits(messages, lo >> 3, count)
        dst = out[lo:lo + m]
        for k in range(m):
            dst[k] = (2 * count[k] - nodes) * node_size


@numba.njit(**_JIT)
def mean_vote(total, size, scale, out):
    """``out[i] = float32(float64(total[i]) / size) * scale``: the reference's operations (the
    mean vote, then, under SGD, times the float32 ``scale``; 1 leaves it as it is;
    vectorised)."""
    divisor = np.float64(size)
    for i in range(total.shape[0]):
        out[i] = np.float32(np.float64(total[i]) / divisor) * scale


def warm(dtype):
    """Run every entry point once on 16 elements of ``dtype`` (``hvdcomp.kernels.warm``)."""
    g = np.ones(16, dtype)
    votes, w = np.zeros(16, np.int8), np.uint32(1)
    c = dtype(0.5)
    lanes = np.zeros(LANES)
    for m in (None, g):
        moments_votes(g, m, m, c, c, c, c, c, w, w, 0, g.copy(), g.copy(), g.copy(), votes, lanes)
        moments_direction(g, m, m, c, c, c, c, c, g.copy(), g.copy(), g.copy(), lanes)
    rebinarise_packed(votes, 2, rebinarise_thresholds(2), w, w, np.zeros(2, np.uint8))
    node_totals(np.zeros((2, 2), np.uint8), 16, 2, votes)
    mean_vote(votes, 2, np.float32(1.0), np.zeros(16, np.float32))
