"""Bidirectional Top-K with error feedback and per-worker add-back: the math, no MPI.

Per step, on every rank i, for each compressed tensor t (length n_t, target count k_t):

1. ``a = e + g``                       (e: this rank's memory, zero at first)
2. ``S_i = top-k_t of |a|`` per tensor (indices and values ``a[S_i]``: the sparse message)
3. Aggregate ("downlink") selection: the ranks agree on an index set ``G`` of at most k_t
   indices per tensor, chosen from the sum of the sparse vectors (exactly, or by the pairwise
   tree merge, see ``TopKMerge``). The value applied at ``j`` in ``G`` is the complete sum over
   ranks ``sum_i a_i[j] [j in S_i]`` (nothing dropped at an intermediate merge is lost), and every
   rank applies the mean, ``value / size``, at ``G`` and 0 elsewhere.
4. Worker error feedback with per-worker add-back (gTop-k style): ``e = a - sent + lost``,
   where ``lost`` are this rank's sent values at indices that lost the global selection
   (``S_i \\ G``). Written directly: ``e = a`` with zeros at ``S_i ∩ G``: the values a rank sent
   whose index won are the only mass that leaves its memory. Hence, exactly (no rounding in the
   memory update), ``sum_i e_i + size * applied == sum_i (e_i_old + g_i)`` up to the rounding of
   the sum that forms each applied value.

Why per-worker add-back and not a shared aggregate memory: the add-back needs no extra state or
traffic (each rank already knows S_i and receives G), every rank's memory only ever holds its
own gradient mass, and the state stays per rank like Marsit's, so checkpoints stay per-rank.

Unidirectional Top-K (``bidirectional=False``) skips step 3's selection: the aggregate is the
sum of all sparse vectors (union of the S_i), and ``e = a`` with zeros at ``S_i``.

Fused layout: a batch's tensors are laid end to end; tensor t owns indices
``[bounds[t], bounds[t+1])``, and every selection keeps at most k_t indices inside each tensor.
Sparse sets are pairs ``(indices, values)`` of 1-D NumPy arrays, indices strictly ascending.
Ties in magnitude are broken by index (the smaller index wins), so every rule here is a
deterministic function of its inputs.
"""
import math

import numpy as np

from hvdcomp.backend.topk import select_topk


def target_count(numel, ratio=None, k=None):
    """k_t for a tensor of ``numel`` elements: ``min(k, numel)``, or ``ceil(ratio * numel)``
    clipped to [1, numel]."""
    if k is not None:
        return min(int(k), int(numel))
    return min(int(numel), max(1, math.ceil(ratio * numel)))


def accumulate(grad, memory):
    """``a = grad + memory`` (``memory`` None means zero); same kind/device as ``grad``."""
    return grad if memory is None else grad + memory


def select(a, k, method="approx", seed=0):
    """This rank's sparse message for one tensor: ``(ascending int64 indices, a[indices])``
    (exact top-k, or the sampled-threshold selection of ``hvdcomp.backend.topk``)."""
    return select_topk(a, k, method=method, seed=seed)


def sum_sets(sets):
    """The sum of sparse vectors: ``(indices, values)`` over the union of their indices, values
    with equal indices summed in the order of ``sets`` (left to right)."""
    sets = [s for s in sets if s[0].size] or list(sets[:1])
    if len(sets) == 1:
        return sets[0]
    idx = np.concatenate([s[0] for s in sets])
    val = np.concatenate([s[1] for s in sets])
    order = np.argsort(idx, kind="stable")  # runs of ascending indices: a linear merge
    idx, val = idx[order], val[order]
    starts = np.flatnonzero(np.concatenate([[True], idx[1:] != idx[:-1]]))
    if starts.size == idx.size:
        return idx, val
    return idx[starts], np.add.reduceat(val, starts)


def sum_pair(a, b):
    """``sum_sets([a, b])``: the sum of two sparse sets (a step of the tree's merge)."""
    return sum_sets([a, b])


def keep_topk(indices, values, bounds, ks):
    """Within each tensor t (indices in ``[bounds[t], bounds[t+1])``), keep the ``ks[t]`` entries
    of largest |value|, ties broken by the smaller index; the result stays ascending."""
    cuts = np.searchsorted(indices, bounds)
    parts, trimmed = [], False
    for t, k in enumerate(ks):
        lo, hi = int(cuts[t]), int(cuts[t + 1])
        if hi - lo <= k:
            parts.append(np.arange(lo, hi))
            continue
        trimmed = True
        mag = np.abs(values[lo:hi])
        cut = np.partition(mag, hi - lo - k)[hi - lo - k]  # the k-th largest magnitude
        chosen = mag > cut
        need = k - int(np.count_nonzero(chosen))
        if need:
            chosen[np.flatnonzero(mag == cut)[:need]] = True  # ties: smallest indices first
        parts.append(np.flatnonzero(chosen) + lo)
    if not trimmed:
        return indices, values
    keep = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return indices[keep], values[keep]


class TopKMerge:
    """The pairwise merge of the global top-k tree: ``merge(a, b) -> (indices, values)``.

    ``a`` and ``b`` are sparse sets (``a`` the receiver's partial, ``b`` the incoming one); the
    result is ``keep_topk(sum_sets([a, b]))``: sum the values of equal indices (a's first), then
    keep per tensor the k_t largest |values|, ties by smaller index. At most k_t per tensor come
    out of 2 k_t candidates. With ``ks=None`` it keeps everything (the unidirectional sum).
    ``pair_sum(a, b)``: how the two sets are summed; default ``sum_pair`` (the fused kernel
    ``hvdcomp.kernels.topk.sum_pair`` gives the same bits).
    """

    def __init__(self, bounds, ks=None, pair_sum=sum_pair):
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.ks = None if ks is None else [int(k) for k in ks]
        self.pair_sum = pair_sum

    def __call__(self, a, b):
        s = self.pair_sum(a, b)
        return s if self.ks is None else keep_topk(s[0], s[1], self.bounds, self.ks)


def global_selection(sets, bounds, ks):
    """The exact downlink rule on all ranks' messages (rank order): the sum of all sparse
    vectors, then the top-k_t per tensor of it (``ks=None``: no second selection)."""
    s = sum_sets(list(sets))
    return s if ks is None else keep_topk(s[0], s[1], bounds, ks)


def won(sent, winners):
    """Boolean mask over ``sent`` (ascending int64 indices): True where the index is in
    ``winners`` (ascending), i.e. where this rank's sent value is part of the applied step."""
    pos = np.searchsorted(winners, sent)
    hit = pos < winners.size
    hit[hit] = winners[pos[hit]] == sent[hit]
    return hit


def new_memory(a, sent_won, copy=True):
    """``e = a`` with zeros at ``sent_won`` (indices into ``a``, same kind/device as ``a``): the
    memory after error feedback with add-back (see the module docstring). ``copy=False``
    writes into ``a`` (when ``a`` is a temporary, not the caller's gradient)."""
    e = (a.clone() if hasattr(a, "clone") else a.copy()) if copy else a
    e[sent_won] = 0
    return e
