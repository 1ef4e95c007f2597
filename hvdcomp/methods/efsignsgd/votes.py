"""A majority vote of sign bits over a ring, exact, whose traffic per rank grows as log N where
an all-gather of the bits grows as N - 1.

``vote_rows(ctx, packed)``: ``packed`` is this rank's vote, packed bits (uint8, bit 1 for +1,
the layout of ``hvdcomp.backend.bits``; the same length on every rank of ``ctx``). Returns a
(2, nbytes) uint8 array, identical on every rank, that votes as the ranks' rows do: for every
bit, the sum of its two ±1 values is +2 where the ranks' sum of ±1 votes is positive, -2 where
it is negative and 0 on a tie. Whatever counts the all-gathered rows (a vote total, EF-signSGD's
fused decode) gets the same majority from these two rows.

1. reduce-scatter: the bytes are cut into ``size`` chunks (``ring.chunk_bounds``); a chunk
   travels the ring as the count of +1 votes among the k ranks it has passed, in bit planes
   (plane j packs bit j of each element's count, like the votes; ``k.bit_length()`` planes),
   and each rank adds its own bits with a ripple carry over the planes (bit-wise on bytes).
   After ``size - 1`` hops each rank owns one chunk's exact counts c over all ranks.
2. all-gather of each chunk's outcome: the sign plane (2c > size) and, with an even size, the
   tie plane (2c == size; an odd size cannot tie).

Traffic per rank, in bits per voted element: ``ring_bits(size)`` = sum over k = 1..size-1 of
``k.bit_length() / size`` + ``(size-1)/size`` times 1 (odd size) or 2 (even); the all-gather's
is ``size - 1``. Rounds: 2 (size - 1) sequential messages, against the all-gather's size - 1.
``ring_pays(size)``: whether the ring moves fewer bits (every size from 3 on; with 2 ranks the
all-gather's 1 bit is less than the ring's 1.5).

``vote_counts(ctx, packed)``: the vote totals themselves (``V``, int32 per element), where the
outcome is not enough: the same reduce-scatter, then each chunk's count planes all-gathered as
they are (``size.bit_length()`` planes): ``count_bits(size)`` bits per element, still log N
(``counts_pay``: fewer than the all-gather's size - 1 from 6 ranks on).
"""
import time

import numpy as np

from hvdcomp.comm.ring import _exchange, chunk_bounds


def ring_bits(size):
    """Bits per voted element that ``vote_rows`` sends per rank among ``size`` ranks."""
    outcome = 1 if size % 2 else 2
    return (sum(k.bit_length() for k in range(1, size)) + (size - 1) * outcome) / size


def ring_pays(size):
    """True where ``vote_rows`` sends fewer bits than an all-gather of the votes (size - 1)."""
    return size > 2 and ring_bits(size) < size - 1


def add_votes(planes, bits, width):
    """The count planes ``planes`` ((w, nbytes) uint8) plus one rank's vote ``bits`` (1 for
    +1): a ((width, nbytes) uint8) array, ``width`` >= w planes (w + 1 where the count may
    carry into a new plane)."""
    out = np.empty((width, bits.size), dtype=np.uint8)
    carry = bits
    for j, plane in enumerate(planes):
        np.bitwise_xor(plane, carry, out=out[j])
        carry = plane & carry
    if width > len(planes):
        out[len(planes)] = carry
    return out


def plane_counts(planes, dtype=np.int64):
    """The counts (``dtype``, 8 per byte) that the bit planes ``planes`` ((w, nbytes) uint8,
    plane j holding bit j) hold."""
    count = np.zeros(planes.shape[1] * 8, dtype=dtype)
    for j, plane in enumerate(planes):
        count += np.unpackbits(plane).astype(dtype) << j
    return count


def outcome(planes, size):
    """The (2, nbytes) rows of ``vote_rows`` from a chunk's count planes over ``size`` ranks."""
    count = plane_counts(planes)
    sign = np.packbits(2 * count > size)
    tie = np.packbits(2 * count == size)
    return np.stack([sign, sign ^ tie])


def vote_rows(ctx, packed):
    """The two rows that vote as all ranks' ``packed`` rows (module docstring); counted in
    ``ctx.stats``."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    if ctx.size == 1:
        return np.stack([packed, packed])
    planes = 1 if ctx.size % 2 else 2  # an odd size cannot tie: the second row is the first
    rows = _ring(ctx, packed, lambda acc: outcome(acc, ctx.size)[:planes])
    return np.stack([rows[0], rows[planes - 1]])


def count_bits(size):
    """Bits per voted element that ``vote_counts`` sends per rank among ``size`` ranks."""
    return (sum(k.bit_length() for k in range(1, size))
            + (size - 1) * size.bit_length()) / size


def counts_pay(size):
    """True where ``vote_counts`` sends fewer bits than an all-gather of the votes (size - 1):
    from 6 ranks on (5: as many)."""
    return size > 2 and count_bits(size) < size - 1


def vote_counts(ctx, packed):
    """``V``, the sum over the ranks of ``ctx`` of the +-1 votes packed in each rank's
    ``packed`` (int32, ``8 * packed.size`` elements, identical on every rank): the exact
    counts of ``vote_rows``' reduce-scatter, all-gathered as they are (``size.bit_length()``
    planes of each chunk's count of +1 votes ``c``; ``V = 2 c - size``). Where the vote's
    outcome is not enough (EF-signSGD under Adam: the mean of the signs), at
    ``count_bits(size)`` bits per element, log N, in 2 (size - 1) rounds; counted in
    ``ctx.stats``."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    width = ctx.size.bit_length()
    planes = _ring(ctx, packed, lambda acc: np.concatenate(
        [acc, np.zeros((width - len(acc), acc.shape[1]), dtype=np.uint8)]))
    return 2 * plane_counts(planes, np.int32) - ctx.size


def _ring(ctx, packed, gathered):
    """Steps 1 and 2 of the module docstring: each chunk's exact count planes (reduce-scatter),
    then ``gathered(planes)`` of every chunk (an array of the same number of rows for every
    chunk, bytes per row as the chunk's) all-gathered; returns those rows, the chunks
    concatenated."""
    size, rank, comm = ctx.size, ctx.rank, ctx.comm
    t0, counts = time.perf_counter(), [0, 0, 0]
    bounds = chunk_bounds(packed.size, size)
    own = [packed[bounds[i]:bounds[i + 1]] for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size

    def send_recv(send, recv):  # 2-D planes, sent and received as flat bytes
        moved = _exchange(comm, np.ascontiguousarray(send).reshape(-1), recv.reshape(-1), right,
                          left)
        counts[:] = [a + b for a, b in zip(counts, moved)]

    acc = own[rank][None, :]  # the chunk this rank starts: its own vote, a count over 1 rank
    for t in range(size - 1):  # after hop t the received chunk counts t + 2 ranks
        r_idx = (rank - t - 1) % size
        incoming = np.empty(((t + 1).bit_length(), own[r_idx].size), dtype=np.uint8)
        send_recv(acc, incoming)
        acc = add_votes(incoming, own[r_idx], (t + 2).bit_length())
    # rank r now holds chunk (r + 1) % size's counts; gather every chunk's rows
    rows = [None] * size
    rows[(rank + 1) % size] = gathered(acc)
    height = len(rows[(rank + 1) % size])
    for t in range(size - 1):
        s_idx, r_idx = (rank + 1 - t) % size, (rank - t) % size
        incoming = np.empty((height, own[r_idx].size), dtype=np.uint8)
        send_recv(rows[s_idx], incoming)
        rows[r_idx] = incoming
    ctx.stats.add(*counts, rounds=2 * (size - 1))
    ctx.stats.seconds += time.perf_counter() - t0
    return np.concatenate(rows, axis=1)
