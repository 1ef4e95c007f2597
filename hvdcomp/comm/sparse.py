"""Moving sparse sets between ranks: point-to-point transfer and the all-gather baseline.

A sparse set is a pair ``(indices, values)`` of 1-D NumPy arrays of equal length. This layer
moves them as they are (their dtypes are the wire format: e.g. int32 indices and float32 values
make 8 bytes per entry); it does not look at what they mean. Every transfer is counted in
``ctx.stats``. Large payloads are split into messages of at most
``context.MAX_MESSAGE_BYTES`` (the ring's splitting), so counts never overflow MPI's int.
"""
import numpy as np

from hvdcomp.comm.ring import _exchange

HEADER_TAG = 30000  # tag of the lengths (int64 each) that precede a payload


def _empty(dtype):
    return np.zeros(0, dtype=dtype)


def send_arrays(ctx, arrays, dest):
    """Send a list of 1-D arrays to rank ``dest``: their lengths (one int64 each), then their
    bytes in one payload. Returns the bytes sent."""
    arrays = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    header = np.array([a.size for a in arrays], dtype=np.int64)
    ctx.comm.Send(header, dest=dest, tag=HEADER_TAG)
    payload = np.concatenate([a.view(np.uint8) for a in arrays] or [_empty(np.uint8)])
    sent, _, msgs = _exchange(ctx.comm, payload, _empty(np.uint8), dest, dest)
    ctx.stats.add(sent + header.nbytes, 0, msgs + 1, rounds=2)
    return sent + header.nbytes


def recv_arrays(ctx, source, dtypes):
    """Receive what ``send_arrays`` sent from rank ``source``, as arrays of ``dtypes`` (which
    must match the sender's)."""
    dtypes = [np.dtype(d) for d in dtypes]
    header = np.empty(len(dtypes), dtype=np.int64)
    ctx.comm.Recv(header, source=source, tag=HEADER_TAG)
    sizes = [int(n) * d.itemsize for n, d in zip(header, dtypes)]
    payload = np.empty(sum(sizes), dtype=np.uint8)
    _, got, msgs = _exchange(ctx.comm, _empty(np.uint8), payload, source, source)
    ctx.stats.add(0, got + header.nbytes, msgs + 1, rounds=2)
    out, off = [], 0
    for nbytes, d in zip(sizes, dtypes):
        out.append(payload[off:off + nbytes].view(d))
        off += nbytes
    return out


def send_set(ctx, s, dest):
    """Send the sparse set ``s`` to rank ``dest`` (see ``send_arrays``)."""
    if s[0].shape != s[1].shape or s[0].ndim != 1:
        raise ValueError("a sparse set is two 1-D arrays of equal length")
    return send_arrays(ctx, s, dest)


def recv_set(ctx, source, idx_dtype, val_dtype):
    """Receive a set sent with ``send_set`` from rank ``source``: ``(indices, values)``."""
    idx, val = recv_arrays(ctx, source, (idx_dtype, val_dtype))
    return idx, val


def allgather_sets(ctx, s):
    """Every rank's set, on every rank: a list indexed by rank (the all-gather baseline).

    Traffic per rank, counted as a ring all-gather would move it: sends its own set to the
    ``size - 1`` others and receives all theirs, i.e. it grows linearly with the number of ranks.
    Each array of the gathered total must hold fewer than 2**31 elements.
    """
    idx, val = np.ascontiguousarray(s[0]), np.ascontiguousarray(s[1])
    counts = ctx.allgather_array([idx.size])[:, 0].astype(np.int64)
    total = int(counts.sum())
    if total >= 2 ** 31:
        raise ValueError(f"allgather_sets: {total} gathered entries exceed MPI's 32-bit counts")
    offsets = np.concatenate([[0], np.cumsum(counts)])
    out = []
    for local in (idx, val):
        buf = np.empty(total, dtype=local.dtype)
        ctx.comm.Allgatherv(local, [buf, counts.tolist()])
        out.append(buf)
    entry = idx.itemsize + val.itemsize
    ctx.stats.add(idx.size * entry * (ctx.size - 1), (total - idx.size) * entry, 2, rounds=2)
    return [(out[0][offsets[r]:offsets[r + 1]], out[1][offsets[r]:offsets[r + 1]])
            for r in range(ctx.size)]
