"""All-reduces of contiguous 1-D NumPy buffers: a ring with a pluggable per-hop combine, and MPI's
own all-reduce for plain sums (``mpi_allreduce``, ``mean_allreduce``).

Which one: the ring for the merges MPI cannot do (Marsit's and BinSGDM's bit merges) and for
SketchFusion's large sums (as float16: ``float16_allreduce``, its hops' partial
sums rounded to float16 as Horovod's fp16 compression sums them); MPI's own for the engine's
exact sums, PowerSGD's P and Q and TopK's
sums at the selected indices. Measured on the emulated cluster (2026-11-28):
- the engine's exact sum alone: 20-30% faster through MPI at 0.1-1M elements, 2 x 2, 1 Gbit/s;
- PowerSGD's few kB per tensor: 10-40% faster (about log2 P rounds run in C, where the ring
  takes 2 (P - 1) Python round trips); TopK: 0.6-1.0x the ring's time;
- but SketchFusion's 1-5 MB tables: 1.4-1.5x slower at 300 Mbit/s on 4 hosts x 1 (the same
  bytes on the links: Open MPI's algorithm for that size keeps them less busy than the ring),
  though 0.8-0.9x at 1 Gbit/s. The engine's sums of that size on such links were not measured.

Contract of ``ring_allreduce(ctx, buf, combine)``:
- ``buf``: a contiguous 1-D NumPy array of any dtype and any length (also 0 or < size); every
  rank passes the same length and dtype. It is overwritten with the result, which is identical
  (bit for bit) on every rank: each chunk is combined by exactly one chain of ranks and then
  copied unchanged to the others.
- ``combine(incoming, own, hops, chunk) -> array``: called once per hop of the reduce-scatter.
  ``incoming`` is the received chunk, already aggregating ``hops`` ranks (1..size-1); ``own`` is
  this rank's chunk ``chunk`` (index into the size chunks); the return value (same length and
  dtype) is what this rank forwards. For a plain sum it is ``incoming + own``.
- Traffic: reduce-scatter, then all-gather, each ``size - 1`` steps; every rank sends and
  receives ``2 * (size - 1) / size * buf.nbytes`` bytes (to chunk rounding), counted in
  ``ctx.stats``. Messages larger than ``context.MAX_MESSAGE_BYTES`` are split, so counts never
  overflow MPI's 32-bit count.
"""
import time

import numpy as np

from hvdcomp.comm import context as _context_mod


def sum_combine(incoming, own, hops, chunk):
    """The plain all-reduce combine: element-wise sum."""
    return incoming + own


def chunk_bounds(n, size):
    """Start offsets of ``size`` nearly equal chunks of ``n`` elements, plus ``n`` at the end."""
    base, extra = divmod(int(n), int(size))
    bounds = [0]
    for i in range(size):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def _exchange(comm, send, recv, right, left):
    """Send ``send`` to ``right`` while receiving ``recv`` from ``left``, in pieces of at most
    MAX_MESSAGE_BYTES (both byte views, contiguous)."""
    step = _context_mod.MAX_MESSAGE_BYTES
    s8, r8 = send.view(np.uint8), recv.view(np.uint8)
    reqs = []
    for tag, off in enumerate(range(0, max(r8.size, 1), step)):
        if r8.size:
            reqs.append(comm.Irecv(r8[off:off + step], source=left, tag=tag))
    for tag, off in enumerate(range(0, max(s8.size, 1), step)):
        if s8.size:
            reqs.append(comm.Isend(s8[off:off + step], dest=right, tag=tag))
    if reqs:
        type(reqs[0]).Waitall(reqs)  # the transport's requests (hvdcomp.comm.transport)
    return s8.size, r8.size, len(reqs)


def ring_allreduce(ctx, buf, combine=sum_combine):
    """All-reduce ``buf`` in place around the ring of ``ctx``'s ranks; returns ``buf``."""
    if not isinstance(buf, np.ndarray) or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise TypeError("ring_allreduce needs a contiguous 1-D numpy array")
    size, rank, comm = ctx.size, ctx.rank, ctx.comm
    if size == 1:
        return buf
    t0 = time.perf_counter()
    bounds = chunk_bounds(buf.size, size)
    chunk = [buf[bounds[i]:bounds[i + 1]] for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    scratch = np.empty(bounds[1] - bounds[0], dtype=buf.dtype)  # chunk 0 is the largest
    sent = recv = msgs = 0
    # Reduce-scatter: after step t, the chunk received aggregates t + 2 ranks.
    for t in range(size - 1):
        s_idx, r_idx = (rank - t) % size, (rank - t - 1) % size
        incoming = scratch[:chunk[r_idx].size]
        a, b, m = _exchange(comm, chunk[s_idx], incoming, right, left)
        sent, recv, msgs = sent + a, recv + b, msgs + m
        chunk[r_idx][...] = combine(incoming, chunk[r_idx], t + 1, r_idx)
    # All-gather: forward finished chunks unchanged; rank r starts with chunk (r + 1) % size.
    for t in range(size - 1):
        s_idx, r_idx = (rank + 1 - t) % size, (rank - t) % size
        a, b, m = _exchange(comm, chunk[s_idx], chunk[r_idx], right, left)
        sent, recv, msgs = sent + a, recv + b, msgs + m
    ctx.stats.add(sent, recv, msgs, rounds=2 * (size - 1))
    ctx.stats.seconds += time.perf_counter() - t0
    return buf


def float16_allreduce(ctx, buf):
    """Sum ``buf`` (a contiguous 1-D float32 NumPy array, the same length on every rank) over
    ``ctx``'s ranks with float16 on the wire (half the bytes of ``ring_allreduce(ctx, buf)``);
    returns ``(sums, sent)``:
    - ``sums``: float32, the ring all-reduce of ``buf`` rounded to float16, each hop's partial sum
      rounded to float16 once (as Horovod's fp16 compression sums), identical on every rank;
    - ``sent``: float32, what this rank contributed (``buf`` rounded to float16), so that a
      caller with error feedback keeps ``buf - sent`` (its own rounding) for a later step; None
      where ``buf`` itself was sent.
    Where the float16 sums are not all finite (a value or a partial sum beyond float16's 65504;
    every rank sees the same sums, so every rank takes the same branch), a copy of ``buf`` is
    summed again in float32 (``ring_allreduce``): ``sent`` is None. ``buf`` is not written. With
    one rank: ``(buf, None)``, nothing rounded."""
    if ctx.size == 1:
        return buf, None  # nothing travels: nothing is rounded
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is caught below
        half = buf.astype(np.float16)
        sent = half.astype(np.float32)
        ring_allreduce(ctx, half)
    sums = half.astype(np.float32)
    if np.isfinite(sums).all():
        return sums, sent
    return ring_allreduce(ctx, buf.copy()), None


def mpi_allreduce(ctx, buf):
    """Sum ``buf`` (a contiguous 1-D float32/float64 NumPy array, the same length on every rank)
    in place over ``ctx``'s ranks by MPI's own all-reduce (``MPI_Allreduce``, in pieces of at
    most MAX_MESSAGE_BYTES); returns ``buf``. The result is identical on every rank: MPI
    requires that all processes of the group receive identical results (MPI 4.1, section 6.9.6).
    Open MPI picks its algorithm by size and runs it in C (when to prefer it: the module
    docstring). Counted in ``ctx.stats`` as the ring's traffic (``2 (size - 1) / size * buf.nbytes`` each way, ``2 (size - 1)``
    messages per piece): what the library sends is its own choice."""
    if not isinstance(buf, np.ndarray) or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise TypeError("mpi_allreduce needs a contiguous 1-D numpy array")
    size = ctx.size
    if size == 1 or buf.size == 0:
        return buf
    from mpi4py import MPI
    t0 = time.perf_counter()
    per_piece = max(_context_mod.MAX_MESSAGE_BYTES // buf.itemsize, 1)
    pieces = 0
    for off in range(0, buf.size, per_piece):
        ctx.comm.Allreduce(MPI.IN_PLACE, buf[off:off + per_piece], op=MPI.SUM)
        pieces += 1
    moved = 2 * (size - 1) * buf.nbytes // size
    ctx.stats.add(moved, moved, 2 * (size - 1) * pieces, rounds=pieces)
    ctx.stats.seconds += time.perf_counter() - t0
    return buf


def mean_allreduce(ctx, arrays, dtype=np.float32):
    """The mean over ``ctx``'s ranks of each host array in ``arrays`` (the same shapes on every
    rank), fused into one ``dtype`` buffer and summed in place by one ``mpi_allreduce``: views
    of that buffer shaped like ``arrays``."""
    parts = [np.asarray(a, dtype=dtype) for a in arrays]
    buf = np.concatenate([p.reshape(-1) for p in parts] or [np.zeros(0, dtype)])
    mpi_allreduce(ctx, buf)
    buf /= ctx.size
    out, off = [], 0
    for p in parts:
        out.append(buf[off:off + p.size].reshape(p.shape))
        off += p.size
    return out
