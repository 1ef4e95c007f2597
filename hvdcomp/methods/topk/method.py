"""``hvdcomp.TopK``: bidirectional Top-K sparsification with error feedback and per-worker
add-back (math in ``hvdcomp.methods.topk.math``, selection in ``hvdcomp.backend.topk``).

Per flush, every large gradient is compensated (``a = e + g``) and sparsified to its own k_t
largest magnitudes (on host float tensors in one fused pass, ``hvdcomp.kernels.topk``;
``HVDCOMP_KERNELS=numpy`` selects the reference path); the batch's messages are laid end to
end (one index space) and exchanged in one collective (``exchange``). State per tensor: the
error-feedback memory ``e``.

What travels, per rank and step, with K = sum of k_t and 8-byte entries (int32 index + float32
value; int64 indices when a batch has 2**31 elements or more):
- ``path='tree'`` (default), bidirectional: a global top-k tree (``hvdcomp.comm.tree``) merges
  the ranks' sets pairwise over ceil(log2 size) rounds, each merge keeping per tensor the k_t
  largest |sums| of at most 2 k_t candidates (``TopKMerge``); the root's index set ``G`` is
  broadcast (4 bytes per index) and the complete sum of every rank's sent values at ``G`` is
  formed by an all-reduce of |G| values (MPI's own, ``hvdcomp.comm.mpi_allreduce``). A rank
  sends at most about
  ``8K + 4K ceil(log2 size) + 8K`` bytes: it grows like log(size).
- ``path='allgather'``: every rank's set goes to every rank (``(size - 1) * 8K`` bytes sent per
  rank: linear in size); every rank sums all sets in rank order and keeps the exact top-k_t of
  the sum per tensor. This is the baseline (and GRACE's design).
Both paths apply, at the selected indices, the complete sum over all ranks of the values sent
there, so the per-worker add-back conserves mass (see ``hvdcomp.methods.topk.math``); they differ
only in how ``G`` is chosen (approximate tree merge vs exact top-k of the full sum). Why the
extra all-reduce on the tree path: a merge may drop a rank's value at an index that still wins
at the root through another subtree; applying the tree's own sums would lose that value, and
the rank could not know that it must add it back. Results are bit-identical on every rank: the
tree's ``G`` comes from one root, the values from MPI's all-reduce (identical on every rank, as
MPI requires); the all-gather path is a deterministic function of the same gathered data on
every rank.

``bidirectional=False`` is unidirectional Top-K: no second selection, the aggregate is the sum of
all sparse vectors (up to size * K entries: traffic grows with size on either path).
"""
import numpy as np

from hvdcomp import feedback, kernels, preconditioning, validate
from hvdcomp.methods.topk import math as alg
from hvdcomp.backend import xp
from hvdcomp.comm import mpi_allreduce
from hvdcomp.comm.sparse import allgather_sets
from hvdcomp.comm.tree import tree_broadcast, tree_reduce
from hvdcomp.methods.contract import Method

PATHS = ("tree", "allgather")
SELECTIONS = ("approx", "exact")


def exchange(ctx, sent, bounds, ks, path="tree", bidirectional=True):
    """The aggregate of every rank's sparse message, identical on every rank.

    Args:
        ctx: the ``CommContext``.
        sent: this rank's message ``(indices, values)``: int64 indices, strictly ascending, in
            the fused index space ``[0, bounds[-1])``; values 1-D float (the wire dtype, the same
            on every rank). Any count per tensor (the approximate selector may send up to
            1.5 k_t); the aggregate rule keeps at most k_t.
        bounds: tensor boundaries in the fused space (length T+1, starts at 0).
        ks: per-tensor target counts k_t (length T).
        path: 'tree' or 'allgather' (see the module docstring).
        bidirectional: False for unidirectional Top-K (sum of all messages, no second top-k).
    Returns:
        ``(indices, sums)``: int64 indices, ascending (at most k_t per tensor when
        bidirectional), and the sum over ranks of the values they sent at each index.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    idt = np.int32 if bounds[-1] < 2 ** 31 else np.int64
    idx, val = np.asarray(sent[0]), np.ascontiguousarray(sent[1])
    wire = (idx.astype(idt), val)
    rule_ks = list(ks) if bidirectional else None
    sum_pair, won = set_ops(val)
    if path == "allgather":
        g = alg.global_selection(allgather_sets(ctx, wire), bounds, rule_ks)
    elif path == "tree":
        merge = alg.TopKMerge(bounds, rule_ks, sum_pair)
        root_set = tree_reduce(ctx, wire, merge)
        if root_set is not None:  # the rule also holds where no merge ran (a single rank)
            root_set = merge(root_set, (wire[0][:0], val[:0]))
        if bidirectional:
            (gidx,) = tree_broadcast(ctx, None if root_set is None else [root_set[0]], [idt])
            sums = np.zeros(gidx.size, dtype=val.dtype)
            hit = won(wire[0], gidx)
            sums[np.searchsorted(gidx, wire[0][hit])] = val[hit]
            g = (gidx, mpi_allreduce(ctx, sums))
        else:
            g = tree_broadcast(ctx, root_set, [idt, val.dtype])
    else:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return np.asarray(g[0], dtype=np.int64), g[1]


def set_ops(values):
    """``(sum_pair, won)`` for sparse sets whose values are like ``values``: the kernels' linear
    merges (``hvdcomp.kernels.topk``) for host float arrays when the kernels are on, else the
    reference's ``alg.sum_pair`` and ``alg.won``. The same results either way."""
    if kernels.active("topk", values):
        from hvdcomp.kernels import topk as fused
        return fused.sum_pair, fused.won
    return alg.sum_pair, alg.won


def compensate_and_select(batch, entry, k, selection, seed):
    """This rank's sparse message for one tensor, ``alg.select`` of ``a = work + e``, with ``a``
    formed on the way (``hvdcomp.feedback``): on host float tensors by the fused scan of
    ``hvdcomp.kernels.topk`` (one pass for the sum and the threshold), else by
    ``feedback.compensate`` before the selection. Same indices and values either way."""
    if not kernels.active("topk", entry.work):
        return alg.select(feedback.compensate(batch, entry), k, selection, seed=seed)
    from hvdcomp.kernels.topk import SumSource
    memory, out = feedback.buffers(batch, entry)
    return alg.select(SumSource(entry.work, memory, out, capacity=2 * k + 64), k, selection,
                      seed=seed)


class TopK(Method):
    """Top-K compression for ``hvd.DistributedOptimizer(..., compression=hvdcomp.TopK)``.

    Args:
        ratio: density per tensor, in (0, 1]: k_t = ceil(ratio * numel). Default 0.01 for a
            gradient, and ``momentum_ratio`` where the user's Adam/AdamW momentum is sent (the
            default preconditioner, ``hvdcomp.preconditioning.FollowAdam``); a ratio given
            here is used for both.
        momentum_ratio: the density of the user's Adam momentum when ``ratio`` is not given.
            Default 0.1: chosen by time to accuracy (benchmarks/convergence.py --tasks recipes,
            AdamW recipe (c): +11.5% loss at 0.01, +3.8% at 0.05, within 1% at 0.1).
        k: instead of ``ratio``, the same count k_t = min(k, numel) for every tensor (int >= 1).
        bidirectional: True (default): the aggregate is sparsified again to k_t per tensor, and
            each rank adds back to its memory the values it sent whose index lost (mass is
            conserved); False: unidirectional Top-K (the sum of all ranks' sparse vectors).
        path: 'tree' (default; traffic O(k log size)) or 'allgather' (the O(k size) baseline).
        selection: 'approx' (default: sampled threshold, count within +-50% of k_t guaranteed,
            see ``hvdcomp.backend.topk``) or 'exact'.
        seed: seed of the selection's samples (with the step and tensor: reproducible runs).
        min_compress_numel, on_nonfinite, fusion, fusion_cost, precondition: as for every
            hvdcomp compressor (``hvdcomp.facade.BatchedCompressor``).
    """

    name = "TopK"
    n_scalars = 0
    kernel_modules = ("topk",)

    def __init__(self, ratio=None, *, momentum_ratio=None, k=None, bidirectional=True,
                 path="tree", selection="approx"):
        if k is not None and (ratio is not None or momentum_ratio is not None):
            raise ValueError("TopK takes ratio= or k=, not both (nor momentum_ratio= with k=)")
        self.k = None if k is None else validate.count("k", k, 1)
        self.ratio = None if k is not None else validate.fraction(
            "ratio", 0.01 if ratio is None else ratio)
        self.momentum_ratio = None if k is not None else validate.fraction(
            "momentum_ratio", momentum_ratio if momentum_ratio is not None else
            0.1 if ratio is None else ratio)
        self.bidirectional = validate.flag("bidirectional", bidirectional)
        self.path = validate.choice("path", path, PATHS)
        self.selection = validate.choice("selection", selection, SELECTIONS)

    def settings(self):
        return {"ratio": self.ratio, "momentum_ratio": self.momentum_ratio, "k": self.k,
                "bidirectional": self.bidirectional,
                "path": self.path, "selection": self.selection}

    def prepare(self, batch):
        return np.zeros((len(batch.entries), 0))  # compensated in reduce, with the selection

    def reduce(self, batch, scalars):
        entries, size = batch.entries, batch.ctx.size
        ks = [alg.target_count(e.numel, self.momentum_ratio if preconditioning.sends_momentum(
            self.preconditioner, e) else self.ratio, self.k) for e in entries]
        bounds = np.cumsum([0] + [e.numel for e in entries])
        with batch.phase("encode"):
            msgs = [compensate_and_select(batch, e, k, self.selection,
                                          batch.key(self.seed, batch.step, t))
                    for t, (e, k) in enumerate(zip(entries, ks))]
            idx = np.concatenate([xp.to_host(m[0]) + off for m, off in zip(msgs, bounds)])
            val = np.concatenate([xp.to_host(m[1]) for m in msgs])
        with batch.phase("comm"):
            gidx, gsum = exchange(batch.ctx, (idx, val), bounds, ks, self.path,
                                  self.bidirectional)
        out = []
        with batch.phase("decode"):
            won = (set_ops(val)[1](idx, gidx) if self.bidirectional
                   else np.ones(idx.size, dtype=bool))
            cut_g, cut_s = np.searchsorted(gidx, bounds), np.searchsorted(idx, bounds)
            for t, e in enumerate(entries):
                off, a = bounds[t], e.compensated
                gsl, ssl = slice(cut_g[t], cut_g[t + 1]), slice(cut_s[t], cut_s[t + 1])
                step = xp.spread(xp.from_host(gsum[gsl] / size, a),
                                 xp.from_host(gidx[gsl] - off, a), e.result_buffer(a))
                sent_won = idx[ssl][won[ssl]] - off
                # an unowned ``a`` is the working gradient (maybe the user's): copied
                feedback.keep(batch, e, alg.new_memory(a, xp.from_host(sent_won, a),
                                                       copy=not e.owned))
                out.append(step)
        return out
