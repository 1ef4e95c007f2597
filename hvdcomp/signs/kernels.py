"""Fused sign-message kernels (numba) for Marsit and EF-signSGD on host float arrays.

Arrays: 1-D, C-contiguous, one float dtype (float32, or float64) for ``g``, ``e``, ``p``,
``step`` and ``memory``, all of length n; packed bits are uint8 of ``ceil(n / 8)`` bytes in the
layout of ``hvdcomp.backend.bits`` (element i is bit ``7 - i % 8`` of byte ``i // 8``; 1 when
the IEEE sign bit is clear, so -0.0 packs as 0; unused bits 0). Outputs go to buffers the caller
gives; nothing full-size is allocated. An output may be the same array as an input where the
contract says so (``memory`` may be ``p``); otherwise arrays must not overlap.

The l1 sum is NumPy's own ``np.abs(p).sum()``, bit for bit: NumPy sums blocks pairwise (halves
split at multiples of 8, leaves of at most 128 elements summed in 8 interleaved lanes, then
``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))`` and the leftover elements one by one) and
the block sums one after another, all in the array's dtype; a block is ``np.getbufsize()``
elements (8192) where NumPy buffers the reduction (NumPy 1.x), the whole array where it does not
(NumPy 2.x's contiguous reductions): ``sum_block()`` finds which, once. The kernel visits the
elements in that order, which is also the order the bits are packed in (a leaf's 8 lanes are the
8 bits of a byte), so compensating, summing and packing is one pass.
"""
import math

import numba
import numpy as np

from hvdcomp.kernels import JIT_OPTIONS as _JIT
from hvdcomp.kernels.simd import compensate8, decode8, decode8_local

LEAF = 128  # NumPy's PW_BLOCKSIZE: pairwise leaves hold at most this many elements
VOTE_BLOCK = 4096  # elements per block of vote_decode (their counts stay in L1)
DEPTH = 64  # stack depth of the pairwise traversal (a block of 2**k elements needs k - 5)


@numba.njit(inline="always", **_JIT)
def _leaf(g, e, p, bits, acc, lo, n):
    """One pairwise leaf ``[lo, lo + n)`` (``lo`` a multiple of 8, n <= LEAF): writes ``p`` and
    ``bits`` there, returns ``sum |p|`` in NumPy's order (8 lanes, then the leftovers)."""
    zero = g.dtype.type(0)
    acc[:] = zero
    end = lo + n - n % 8
    for i in range(lo, end, 8):
        bits[i >> 3] = compensate8(g, e, p, acc, i)
    res = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    if n < 8:
        res = zero
    byte = np.uint8(0)
    for i in range(end, lo + n):  # the last byte of the array: fewer than 8 elements
        v = g[i] if e is None else g[i] + e[i]
        if p is not None:
            p[i] = v
        res += abs(v)
        if math.copysign(1.0, v) > 0:
            byte |= np.uint8(1 << (7 - (i - end)))
    if end < lo + n:
        bits[end >> 3] = byte
    return res


@numba.njit(inline="always", **_JIT)
def _split(n):
    """The length of the left half of a pairwise node of ``n`` elements (a multiple of 8)."""
    half = n // 2
    return half - half % 8


@numba.njit(**_JIT)
def _block(g, e, p, bits, acc, lo, n, stack, left):
    """NumPy's pairwise sum of ``|p|`` over ``[lo, lo + n)``, fused with compensation and
    packing: the recursion (halves split by ``_split``, leaves of at most LEAF elements) walked
    with an explicit stack, so that no function call is made per leaf. ``stack``: int64
    (DEPTH, 3) nodes (start, length, 1 once the right half is under way); ``left``: each
    node's left sum."""
    top = 0
    stack[0, 0], stack[0, 1], stack[0, 2] = lo, n, 0
    while True:
        while stack[top, 1] > LEAF:  # descend to the leftmost leaf
            stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = \
                stack[top, 0], _split(stack[top, 1]), 0
            top += 1
        val = _leaf(g, e, p, bits, acc, stack[top, 0], stack[top, 1])
        while top > 0:  # hand the value up: a left half's waits for its sibling's
            top -= 1
            if stack[top, 2] == 0:
                left[top], stack[top, 2] = val, 1
                half = _split(stack[top, 1])
                stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = \
                    stack[top, 0] + half, stack[top, 1] - half, 0
                top += 1
                break
            val = left[top] + val
        else:
            return val


@numba.njit(**_JIT)
def _encode(g, e, p, bits, block):
    """The fused pass (``encode``); ``block``: NumPy's reduction block, a multiple of 8."""
    n = g.shape[0]
    total = g.dtype.type(0)
    acc = np.empty(8, g.dtype)
    stack = np.empty((DEPTH, 3), np.int64)
    left = np.empty(DEPTH, g.dtype)
    for lo in range(0, n, block):
        total += _block(g, e, p, bits, acc, lo, min(block, n - lo), stack, left)
    return total


def encode(g, e, p, bits):
    """One pass: ``p = g + e``, the sign bits of ``p`` into ``bits``, and ``np.abs(p).sum()``.

    Args:
        g: the gradient (length n); read only.
        e: the memory (length n), or None (the first step: ``p`` is ``g`` itself).
        p: where ``g + e`` goes (length n), or None when ``e`` is None.
        bits: uint8, ``ceil(n / 8)`` bytes: the packed signs of ``p``, every byte written.
    Returns:
        ``sum |p|`` as a Python float, equal to NumPy's ``float(np.abs(p).sum())`` bit for bit.
    """
    return float(_encode(g, e, p, bits, sum_block()))


_SUM_BLOCK = []  # sum_block()'s answer, found at the first call


def sum_block():
    """The number of elements NumPy sums pairwise before adding the partial sums one after
    another for a contiguous float array: ``np.getbufsize()`` where its reductions are buffered,
    the whole array (any length) where they are not. Found once, by comparing this module's sum
    with NumPy's on probes of a dozen blocks (both dtypes, a wide range of magnitudes);
    ``RuntimeError`` where neither order reproduces NumPy's."""
    if not _SUM_BLOCK:
        candidates = (1 << 62, np.getbufsize()) if np.lib.NumpyVersion(np.__version__) >= "2.0.0" \
            else (np.getbufsize(), 1 << 62)
        rng = np.random.default_rng(0)
        n = 12 * np.getbufsize() + 5
        probes = [(rng.standard_normal(n) * rng.exponential(1.0, n)).astype(dtype)
                  for dtype in (np.float32, np.float64) for _ in range(3)]
        bits = np.empty((n + 7) // 8, np.uint8)
        for block in candidates:
            if block % 8 == 0 and all(float(_encode(x, None, None, bits, block))
                                      == float(np.abs(x).sum()) for x in probes):
                _SUM_BLOCK.append(block)
                break
        else:
            raise RuntimeError(f"NumPy {np.__version__} sums floats in an order that "
                               "hvdcomp.signs.kernels does not reproduce")
    return _SUM_BLOCK[0]


@numba.njit(**_JIT)
def _marsit_decode(bits, p, step, memory, d, c1, c2, use_local):
    """The fused pass of ``marsit_decode``; ``d``, ``c1``, ``c2`` in ``p``'s dtype."""
    n = p.shape[0]
    end = n - n % 8
    for i in range(0, end, 8):
        if use_local:
            decode8_local(bits[i >> 3], p, step, memory, i, d, c1, c2)
        else:
            decode8(bits[i >> 3], p, step, memory, i, d, c1)
    for i in range(end, n):  # the last, partial byte
        up = (bits[i >> 3] >> (7 - (i & 7))) & 1
        s, m = (d, p[i] - c1) if up else (-d, p[i] - (-c1))
        if use_local:
            m -= math.copysign(c2, p[i])
        step[i] = s
        memory[i] = m
    return 0


def marsit_decode(bits, p, delta, memory_factor, local, step, memory):
    """One pass of Marsit's decode (``hvdcomp.signs.merge.apply`` with the own message):
    for each element, ``b = +1`` where the merged bit is 1, else ``-1``;
    ``step = delta * b`` and ``memory = (p - memory_factor * b) - copysign(local, p)``, each
    constant rounded to ``p``'s dtype first (as NumPy does with a Python scalar), so both
    are the reference's bit for bit.

    Args:
        bits: the merged packed bits (uint8, ``ceil(n / 8)`` bytes).
        p: the compensated gradient (length n); read.
        delta, memory_factor: Python floats (``memory_factor``: ``(1 - a) * delta``, or
            ``delta`` when the local share ``a`` is 0).
        local: ``a * own_scale`` (Python float), or None with no local share (nothing is
            subtracted then).
        step: output (length n). memory: output (length n); may be ``p`` itself.
    """
    t = p.dtype.type
    _marsit_decode(bits, p, step, memory, t(delta), t(memory_factor),
                   t(0.0 if local is None else abs(local)), local is not None)


@numba.njit(inline="always", **_JIT)
def count_bits(rows, byte_lo, count):
    """``count[k]``: how many of the ``rows`` (uint8, (R, nbytes), ``hvdcomp.backend.bits``
    layout) have bit k set, counting from byte ``byte_lo`` of each row, for k < len(count). Row
    by row over zero-based slices: a loop LLVM vectorises (with the rows innermost it does not,
    2.5x slower). Blocks of ``VOTE_BLOCK`` keep ``count`` in L1."""
    count[:] = 0
    m = count.shape[0]
    for r in range(rows.shape[0]):
        row = rows[r, byte_lo:byte_lo + ((m + 7) >> 3)]
        for k in range(m):
            count[k] += (row[k >> 3] >> (7 - (k & 7))) & 1


@numba.njit(**_JIT)
def _vote_decode(rows, off, p, step, memory, scale, own):
    """The fused pass of ``vote_decode``, ``VOTE_BLOCK`` elements at a time: the block's "up"
    votes (``count_bits``), then its step and memory (``memory`` None: into ``p``). Every loop
    indexes zero-based slices by its counter, so numba drops its negative-index checks and LLVM
    can vectorise; and the in-place memory is written through ``p``'s own slice, as LLVM
    vectorises no loop whose distinct arrays may overlap (5x slower when ``memory`` was passed
    as ``p``)."""
    ranks, n = rows.shape[0], p.shape[0]
    one, zero = p.dtype.type(1), p.dtype.type(0)
    ups = np.empty(VOTE_BLOCK, np.int32)
    for lo in range(0, n, VOTE_BLOCK):  # lo is a multiple of 8: element lo + k is bit k & 7
        m = min(VOTE_BLOCK, n - lo)
        up = ups[:m]
        count_bits(rows, off + (lo >> 3), up)
        ps, st = p[lo:lo + m], step[lo:lo + m]
        me = ps if memory is None else memory[lo:lo + m]
        for k in range(m):
            votes = 2 * up[k] - ranks
            sign = one if votes > 0 else (-one if votes < 0 else zero)
            st[k] = sign * scale
            me[k] = ps[k] - math.copysign(own, ps[k])
    return 0


def vote_decode(rows, off, p, scale, own_scale, step, memory):
    """One pass of EF-signSGD's decode (``hvdcomp.methods.efsignsgd.method``): the vote ``V`` (sum over ranks of
    the +-1 bits), ``step = sign(V) * scale`` (0 on a tie) and
    ``memory = p - copysign(own_scale, p)``, constants rounded to ``p``'s dtype first, as in
    the reference.

    Args:
        rows: uint8 (ranks, nbytes), C-contiguous: every rank's packed message; this tensor's
            bits start at byte ``off`` of each row.
        p: the compensated gradient (length n); read.
        scale: the step size (mean of the ranks' scales); own_scale: this rank's scale.
        step, memory: outputs (length n); ``memory`` may be ``p`` itself.
    """
    t = p.dtype.type
    _vote_decode(rows, int(off), p, step, None if memory is p else memory, t(scale),
                 t(abs(own_scale)))


def warm(dtype):
    """Run every entry point once on 16 elements of ``dtype`` (``hvdcomp.kernels.warm``)."""
    g, e, p, step = (np.ones(16, dtype) for _ in range(4))
    bits = np.zeros(2, np.uint8)
    encode(g, None, None, bits)
    encode(g, e, p, bits)
    for local in (None, 0.1):
        marsit_decode(bits, p, 1.0, 1.0, local, step, p)
    for memory in (p, e):
        vote_decode(np.zeros((2, 2), np.uint8), 0, p, 1.0, 1.0, step, memory)

