"""The Count-Sketch's table filled in one pass, and its full unsketch fused with the median over
rows (numba), for host arrays.

``sketch(x, offsets, signs, table)`` adds every row's contribution of ``x`` to the zeroed float32
``table`` (r, c) in one pass over ``x``: each chunk is cut where any row's bucket wraps around,
and every piece is added to the r rows' contiguous slices (``table[j, b] += s * x[i]``: with
s = -1 that is the reference's ``table[j, b] - x[i]`` exactly). Every bucket receives its
contributions in chunk order, as in the reference (``hvdcomp.methods.sketchfusion.sketch.sketch``), so the
table is the reference's bit for bit; x float32, 1-D, C-contiguous.

``unsketch(table, offsets, signs, n, out)`` writes, for every position i < n, the median over
the r rows of ``signs[j, q] * table[j, (i % c + offsets[j, q]) % c]`` (``q = i // c``; the
offset hashing of ``hvdcomp.methods.sketchfusion.sketch``), one pass over ``out`` and no n-sized temporary
(the reference builds an r x BLOCK block of estimates, then r-1 min/max passes over it). The
median of the r estimates is taken by sorting them (insertion sort; r <= 9): the middle value,
or for even r the float32 mean of the two middle ones, ``(a + b) / 2``, as the reference
computes it, so the estimates are the reference's (a median selects; only the sign of a zero
can differ, which no magnitude or sum sees).

Arrays: ``table`` float32 (r, c) C-contiguous; ``offsets`` int64 and ``signs`` int8, (r,
chunks); ``out`` float32 of length n.
"""
import numba
import numpy as np

from hvdcomp.kernels import JIT_OPTIONS as _JIT

MAX_ROWS = 9


@numba.njit(inline="always", **_JIT)
def _add_run(src, sign, dst):
    for i in range(src.shape[0]):
        dst[i] += sign * src[i]


@numba.njit(**_JIT)
def _sketch(x, offsets, signs, table):
    rows, c = table.shape
    n = x.shape[0]
    cuts = np.empty(rows + 2, np.int64)
    for q in range(offsets.shape[1]):
        lo = q * c
        m = min(c, n - lo)
        cuts[0], cuts[rows + 1] = 0, m
        for j in range(rows):
            cuts[j + 1] = c - offsets[j, q]
        cuts[1:rows + 1].sort()
        for t in range(rows + 1):
            a, e = max(cuts[t], 0), min(cuts[t + 1], m)
            if a >= e:
                continue
            piece = x[lo + a:lo + e]
            for j in range(rows):
                o = offsets[j, q]
                b = a + o if a + o < c else a + o - c
                _add_run(piece, np.float32(signs[j, q]), table[j, b:b + e - a])


def sketch(x, offsets, signs, table):
    """Adds the sketch of ``x`` to ``table`` (module docstring)."""
    _sketch(x, offsets, signs, table)


@numba.njit(inline="always", **_JIT)
def _estimate(table, offsets, signs, j, q, p, c):
    b = p + offsets[j, q]
    if b >= c:
        b -= c
    v = table[j, b]
    return -v if signs[j, q] < 0 else v


@numba.njit(inline="always", **_JIT)
def _median3_run(r0, r1, r2, s0, s1, s2, out):
    """``out[i] = median(r0[i] * s0, r1[i] * s1, r2[i] * s2)`` as
    ``max(min(x, y), min(max(x, y), z))``. Slices indexed from 0 by the loop counter: numba then
    drops its negative-index check, and LLVM vectorises the loop (5x faster)."""
    for i in range(out.shape[0]):
        x = r0[i] * s0
        y = r1[i] * s1
        z = r2[i] * s2
        lo = x if x < y else y
        hi = y if x < y else x
        mid = hi if hi < z else z
        out[i] = lo if lo > mid else mid


@numba.njit(**_JIT)
def _unsketch3(table, offsets, signs, n, out):
    """r = 3: ``max(min(x, y), min(max(x, y), z))``, the reference's formula. Each chunk is cut
    where a row's bucket wraps around, so every piece reads three contiguous table slices."""
    c = table.shape[1]
    t0, t1, t2 = table[0], table[1], table[2]
    cuts = np.empty(5, np.int64)
    for q in range(offsets.shape[1]):
        lo = q * c
        m = min(c, n - lo)
        o0, o1, o2 = offsets[0, q], offsets[1, q], offsets[2, q]
        s0, s1, s2 = (np.float32(signs[0, q]), np.float32(signs[1, q]),
                      np.float32(signs[2, q]))
        cuts[0], cuts[1], cuts[2], cuts[3], cuts[4] = 0, c - o0, c - o1, c - o2, m
        cuts[1:4].sort()
        for t in range(4):
            a, e = max(cuts[t], 0), min(cuts[t + 1], m)
            if a >= e:
                continue
            d0 = o0 if a + o0 < c else o0 - c
            d1 = o1 if a + o1 < c else o1 - c
            d2 = o2 if a + o2 < c else o2 - c
            _median3_run(t0[a + d0:e + d0], t1[a + d1:e + d1], t2[a + d2:e + d2], s0, s1, s2,
                         out[lo + a:lo + e])


@numba.njit(**_JIT)
def _unsketch_sorted(table, offsets, signs, n, out):
    """Any r <= MAX_ROWS: the r estimates sorted (insertion sort), then the middle."""
    rows, c = table.shape
    est = np.empty(rows, np.float32)
    for q in range(offsets.shape[1]):
        lo = q * c
        for p in range(min(c, n - lo)):
            for j in range(rows):
                v = _estimate(table, offsets, signs, j, q, p, c)
                k = j - 1
                while k >= 0 and est[k] > v:
                    est[k + 1] = est[k]
                    k -= 1
                est[k + 1] = v
            if rows % 2:
                out[lo + p] = est[rows // 2]
            else:
                out[lo + p] = (est[rows // 2 - 1] + est[rows // 2]) / np.float32(2)


def unsketch(table, offsets, signs, n, out):
    """Every position's estimate into ``out`` (module docstring)."""
    (_unsketch3 if table.shape[0] == 3 else _unsketch_sorted)(table, offsets, signs, n, out)


def warm(dtype=np.float32):
    """Compile (or load from the cache) the kernel (``hvdcomp.kernels.warm``)."""
    out = np.empty(4, np.float32)
    for rows in (3, 5):
        sketch(out, np.zeros((rows, 2), np.int64), np.ones((rows, 2), np.int8),
               np.zeros((rows, 2), np.float32))
        unsketch(np.zeros((rows, 2), np.float32), np.zeros((rows, 2), np.int64),
                 np.ones((rows, 2), np.int8), 4, out)
