"""TopK's compensation fused with the selection's threshold scan, and the sorted-set merges of
its exchange (numba), for host arrays.

``SumSource(g, e, out)`` is a ``hvdcomp.backend.topk.Source`` for ``x = g + e`` that never
makes a pass of its own for the sum: the sample is read as ``g[pos] + e[pos]`` (the same float
additions as the full sum), and the first ``above(threshold)`` scan writes ``out = g + e`` while
it compares, one pass over ``g``, ``e`` and ``out``. The selectors of ``hvdcomp.backend.topk``
run unchanged on it, so the selected indices and values are the reference's exactly.

Arrays: ``g``, ``e``, ``out`` 1-D, C-contiguous, one float dtype (float32/float64), length n;
``e`` and ``out`` None on the first step, or for a vector that is complete (SketchFusion's
estimates): then x is ``g`` itself and every scan is the 8-lane threshold scan alone.

``sum_pair(a, b)`` and ``won(sent, winners)`` are ``hvdcomp.methods.topk.math.sum_sets([a, b])``
and ``won`` for ascending index sets, by one linear two-pointer pass instead of a sort and a
binary search per element: the same indices, and the same values bit for bit (equal indices are
summed as ``a + b``, as the reference's ``np.add.reduceat`` of its stable sort does).
"""
import numba
import numpy as np

from hvdcomp.backend.topk import Source, _above
from hvdcomp.kernels import JIT_OPTIONS as _JIT
from hvdcomp.kernels.simd import sum_above8


@numba.njit(**_JIT)
def _sum_scan(g, e, out, threshold, found):
    """Writes ``out = g + e`` and the ascending indices with ``|x| >= threshold`` into
    ``found`` (as many as fit in all but its last slot, a scratch slot for the branch-free
    compaction); returns how many there are (possibly more than fit). 8 lanes at a time
    (``simd.sum_above8``); the few lanes that pass are collected from the lane mask. With ``e``
    and ``out`` None, x is ``g``: the scan alone."""
    n, last, count = g.shape[0], found.shape[0] - 1, 0
    end = n - n % 8
    for i in range(0, end, 8):
        mask = sum_above8(g, e, out, i, threshold)
        if mask:
            for k in range(8):
                found[min(count, last)] = i + k
                count += (mask >> k) & 1
    for i in range(end, n):
        if e is None:
            v = g[i]
        else:
            v = g[i] + e[i]
            out[i] = v
        found[min(count, last)] = i
        count += abs(v) >= threshold
    return count


@numba.njit(**_JIT)
def _merge_sum(ai, av, bi, bv, oi, ov):
    """Writes the union of ascending ``ai`` and ``bi`` into ``oi`` and the values into ``ov``
    (``av + bv`` at shared indices); returns the count."""
    i = j = n = 0
    while i < ai.shape[0] and j < bi.shape[0]:
        if ai[i] < bi[j]:
            oi[n], ov[n] = ai[i], av[i]
            i += 1
        elif bi[j] < ai[i]:
            oi[n], ov[n] = bi[j], bv[j]
            j += 1
        else:
            oi[n], ov[n] = ai[i], av[i] + bv[j]
            i += 1
            j += 1
        n += 1
    while i < ai.shape[0]:
        oi[n], ov[n] = ai[i], av[i]
        i += 1
        n += 1
    while j < bi.shape[0]:
        oi[n], ov[n] = bi[j], bv[j]
        j += 1
        n += 1
    return n


def sum_pair(a, b):
    """``sum_sets([a, b])`` of two sparse sets ``(ascending indices, values)`` of one index dtype
    and one value dtype (module docstring)."""
    (ai, av), (bi, bv) = a, b
    if bi.size == 0:
        return ai, av
    if ai.size == 0:
        return bi, bv
    oi = np.empty(ai.size + bi.size, dtype=ai.dtype)
    ov = np.empty(oi.size, dtype=av.dtype)
    n = _merge_sum(ai, av, bi, bv, oi, ov)
    return oi[:n], ov[:n]


@numba.njit(**_JIT)
def _won(sent, winners, hit):
    j = 0
    for i in range(sent.shape[0]):
        while j < winners.shape[0] and winners[j] < sent[i]:
            j += 1
        hit[i] = j < winners.shape[0] and winners[j] == sent[i]


def won(sent, winners):
    """Boolean mask over ``sent`` (ascending): True where the index is in ``winners``
    (ascending, the same dtype)."""
    hit = np.empty(sent.size, dtype=np.bool_)
    _won(sent, winners.astype(sent.dtype, copy=False), hit)
    return hit


class SumSource(Source):
    """The selection's view of ``x = g + e`` (module docstring); ``array()`` is ``out`` (or
    ``g`` on the first step), complete once the first scan (or ``array()`` itself) has run."""

    def __init__(self, g, e, out, capacity):
        """``capacity``: how many indices a scan keeps (the selectors need all of them only when
        at most about 1.5 k pass; beyond, NumPy's scan is redone on x)."""
        self.g, self.e, self.shape = g, e, g.shape
        self.x = g if e is None else out
        self.capacity, self.done = int(capacity), e is None

    def sampled(self, m, seed):
        pos = np.random.default_rng(seed).integers(0, self.shape[0], size=m)
        return np.abs(self.g[pos] if self.e is None else self.g[pos] + self.e[pos])

    def above(self, threshold):
        found = np.empty(self.capacity + 1, dtype=np.int64)
        threshold = self.x.dtype.type(threshold)  # NumPy compares in x's dtype
        if self.done:  # x is complete: the scan alone
            count = _sum_scan(self.x, None, None, threshold, found)
        else:
            count = _sum_scan(self.g, self.e, self.x, threshold, found)
            self.done = True
        return found[:count] if count <= self.capacity else _above(self.x, threshold)

    def array(self):
        if not self.done:
            np.add(self.g, self.e, out=self.x)
            self.done = True
        return self.x


def warm(dtype):
    """Run the fused scan once on 16 elements of ``dtype`` (``hvdcomp.kernels.warm``)."""
    g, e, out = (np.ones(16, dtype) for _ in range(3))
    for e_ in (e, None):
        src = SumSource(g, e_, out, 4)
        src.above(1.0)
        src.above(1.0)  # again: x complete, the scan alone
    for idt in (np.int32, np.int64):  # the wire's index dtypes (int64 beyond 2**31 elements)
        idx = np.arange(4, dtype=idt)
        sum_pair((idx, g[:4]), (idx + 2, g[:4]))
        won(idx, idx[1:])

