"""Tree reduction of sparse sets with a pluggable merge, and a binomial-tree broadcast.

``tree_reduce(ctx, s, merge, root=0)`` combines every rank's sparse set ``s = (indices,
values)`` (1-D NumPy arrays; every rank uses the same dtypes, which are the wire format) into
one set at ``root`` in ``ceil(log2 size)`` rounds, for any number of ranks:

- ranks are numbered relative to the root (``v = (rank - root) % size``); ``p2`` is the largest
  power of two <= size.
- fold round (only when size is not a power of two): rank ``v = p2 + j`` sends its set to
  ``v = j`` (j < size - p2), which replaces its own by ``merge(own, incoming)``.
- rounds s = 0, 1, ..., log2(p2) - 1: rank ``v`` with ``v % 2**(s+1) == 2**s`` sends its set to
  ``v - 2**s``, which replaces its own by ``merge(own, incoming)``.

``merge(a, b) -> (indices, values)`` is supplied by the caller (e.g. "sum equal indices, keep
the top-k"); ``a`` is always the receiver's (lower virtual rank) partial, so the combination
order is fixed by the schedule alone. ``tree_schedule(size)`` lists the rounds.

``tree_broadcast(ctx, arrays, dtypes, root=0)`` sends 1-D arrays from ``root`` to every rank
along a binomial tree (``ceil(log2 size)`` rounds; in round s, the ``2**s`` ranks that have the
data send it to rank ``v + 2**s``). Every rank ends with a bit-identical copy of the root's data.

Traffic (bytes counted in ``ctx.stats``): in the reduction every non-root rank sends one set and
a rank receives at most ``ceil(log2 size)`` sets; in the broadcast a rank sends at most
``ceil(log2 size)`` copies and receives one. With sets of bounded size (top-k merges), per-rank
traffic grows like log(size), not linearly as in an all-gather. Each payload is preceded by its
lengths (8 bytes per array); payloads larger than ``context.MAX_MESSAGE_BYTES`` are split.
"""
import numpy as np

from hvdcomp.comm.sparse import recv_arrays, recv_set, send_arrays, send_set


def tree_schedule(size):
    """The reduction rounds: a list of rounds, each a list of (sender, receiver) virtual ranks."""
    size = int(size)
    p2 = 1 << (size.bit_length() - 1)
    rounds = []
    if p2 < size:
        rounds.append([(p2 + j, j) for j in range(size - p2)])
    s = 1
    while s < p2:
        rounds.append([(v, v - s) for v in range(s, p2, 2 * s)])
        s *= 2
    return rounds


def tree_reduce(ctx, s, merge, root=0):
    """The merge of every rank's set, at ``root`` (other ranks get None). See module doc."""
    size = ctx.size
    v = (ctx.rank - root) % size
    acc = (np.ascontiguousarray(s[0]), np.ascontiguousarray(s[1]))
    idt, vdt = acc[0].dtype, acc[1].dtype
    for pairs in tree_schedule(size):
        for sender, receiver in pairs:
            if v == sender:
                send_set(ctx, acc, (receiver + root) % size)
                return None
            if v == receiver:
                incoming = recv_set(ctx, (sender + root) % size, idt, vdt)
                acc = merge(acc, incoming)
                if acc[0].dtype != idt or acc[1].dtype != vdt:
                    raise TypeError("tree_reduce: merge() must keep the dtypes of its inputs")
    return acc


def tree_broadcast(ctx, arrays, dtypes, root=0):
    """``root``'s 1-D ``arrays`` (a list; ignored on other ranks) on every rank, as a list of
    arrays of ``dtypes`` (the same list on every rank)."""
    size = ctx.size
    v = (ctx.rank - root) % size
    data = [np.ascontiguousarray(a, dtype=d) for a, d in zip(arrays, dtypes)] if v == 0 else None
    mask = 1
    while mask < size:
        if v < mask and v + mask < size:
            send_arrays(ctx, data, (v + mask + root) % size)
        elif mask <= v < 2 * mask:
            data = recv_arrays(ctx, (v - mask + root) % size, dtypes)
        mask *= 2
    return data
