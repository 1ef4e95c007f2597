"""TopK's compensation fused with the selection's threshold scan (numba), for host arrays.

``SumSource(g, e, out)`` is a ``hvdcomp.backend.topk.Source`` for ``x = g + e`` that never
makes a pass of its own for the sum: the sample is read as ``g[pos] + e[pos]`` (the same float
additions as the full sum), and the first ``above(threshold)`` scan writes ``out = g + e`` while
it compares, one pass over ``g``, ``e`` and ``out``. The selectors of ``hvdcomp.backend.topk``
run unchanged on it, so the selected indices and values are the reference's exactly.

Arrays: ``g``, ``e``, ``out`` 1-D, C-contiguous, one float dtype (float32/float64), length n;
``e`` and ``out`` None on the first step (then x is ``g`` itself: nothing to fuse, the
reference scan runs).
"""
import numba
import numpy as np

from hvdcomp.backend.topk import Source, _above
from hvdcomp.kernels.simd import sum_above8

_JIT = dict(cache=True, nogil=True)


@numba.njit(**_JIT)
def _sum_scan(g, e, out, threshold, found):
    """Writes ``out = g + e`` and the ascending indices with ``|x| >= threshold`` into
    ``found`` (as many as fit in all but its last slot, a scratch slot for the branch-free
    compaction); returns how many there are (possibly more than fit). 8 lanes at a time
    (``simd.sum_above8``); the few lanes that pass are collected from the lane mask."""
    n, last, count = g.shape[0], found.shape[0] - 1, 0
    end = n - n % 8
    for i in range(0, end, 8):
        mask = sum_above8(g, e, out, i, threshold)
        if mask:
            for k in range(8):
                found[min(count, last)] = i + k
                count += (mask >> k) & 1
    for i in range(end, n):
        v = g[i] + e[i]
        out[i] = v
        found[min(count, last)] = i
        count += abs(v) >= threshold
    return count


class SumSource(Source):
    """The selection's view of ``x = g + e`` (module docstring); ``array()`` is ``out`` (or
    ``g`` on the first step), complete once the first scan (or ``array()`` itself) has run."""

    def __init__(self, g, e, out, capacity):
        """``capacity``: how many indices the first scan keeps (the selectors need all of them
        only when at most about 1.5 k pass; beyond, the scan is redone on ``out``)."""
        self.g, self.e, self.shape = g, e, g.shape
        self.x = g if e is None else out
        self.capacity, self.done = int(capacity), e is None

    def sampled(self, m, seed):
        pos = np.random.default_rng(seed).integers(0, self.shape[0], size=m)
        return np.abs(self.g[pos] if self.e is None else self.g[pos] + self.e[pos])

    def above(self, threshold):
        if self.done:
            return _above(self.x, threshold)
        found = np.empty(self.capacity + 1, dtype=np.int64)
        threshold = self.x.dtype.type(threshold)  # NumPy compares in x's dtype
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
    SumSource(g, e, out, 4).above(1.0)
    SumSource(g, None, out, 4).above(1.0)

