"""``hvdcomp.BinSGDM``: one-bit momentum (Birder) over a hierarchical 1-bit all-reduce
(math in ``hvdcomp.algorithms.binsgdm``, stages in ``hvdcomp.comm.hierarchy``).

The compressor carries the momentum: ``decompress`` returns the mean over ranks of the ±1 votes
(float32 values in [-1, 1], multiples of 1/nodes, or of 1/size on a single node), so the user's
inner optimizer must be plain SGD *without momentum*; its ``weight_decay`` then gives the
decoupled update ``x -= lr * (mean_q + wd * x)``::

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=2e-3, weight_decay=wd),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcomp.BinSGDM)

Each coordinate moves by at most ``lr`` per step (like Adam), so use Adam-like learning rates,
not SGD's (the 4-rank digits test: lr 0.002, where SGD-momentum uses 0.05). No warm-up, no error
feedback.

One rank: the compressor then moves nothing and returns the rank's own votes, but Horovod's torch
``DistributedOptimizer`` calls no compressor at all when ``size() == 1`` (it registers its hooks
only for size > 1 or with ``HOROVOD_ELASTIC=1``), so without that variable a 1-rank run is plain
SGD on raw gradients (tested in tests/test_binsgdm.py).

Per flush all gradients (of any size: small tensors are binarised too, so every parameter gets
the same update rule) are fused into one vector of d votes. Wire, per rank, with L ranks per
node and N nodes: inside the node int8 (d (L-1)/L bytes scattered, the same gathered back, as
int8 when size <= 127); between nodes ``(N-1) * d / (8 L)`` bytes, i.e. each node's 1 bit per
element to every other node. Per-step figures by leg: ``last_legs`` ({'intra', 'inter'}:
CommStats); the totals are in ``last_stats`` as for every compressor.

State per tensor: ``(m, v)`` (float32, like the working gradient), checkpointed by
``state_dict()``; the random votes are keyed by (seed, step, rank), so a resumed run repeats the
uninterrupted one bit for bit.
"""
import numbers

import numpy as np

from hvdcomp.algorithms import binsgdm as alg
from hvdcomp.algorithms import moment_constants
from hvdcomp.backend import pack_signs, unpack_signs
from hvdcomp.backend import xp
from hvdcomp.comm.hierarchy import Hierarchy, small_int_dtype
from hvdcomp.compressor import BatchedCompressor


class BinSGDM(BatchedCompressor):
    """BinSGDM for ``hvd.DistributedOptimizer(SGD(..., momentum=0), compression=hvdcomp.BinSGDM)``.

    Args:
        betas: ``(b1, b2)``: momentum ``m = b1 m + (1-b1) g`` and normaliser
            ``v = b2 v + (1-b2) |g|``. Default (0.9, 0.9): with equal betas ``|m| <= v``, so
            ``u = m / v`` is in [-1, 1] without clipping, with no bias to correct (the state
            starts at m = g, v = |g|); a slower normaliser (e.g. 0.999) is allowed and clipped.
            See ``hvdcomp.algorithms.binsgdm``.
        eps: added to ``v`` (guards coordinates whose gradient has always been 0).
        on_nonfinite: 'raise' (default) or 'skip' a step whose gradients hold NaN/Inf anywhere
            (a skipped step returns zeros and leaves (m, v) unchanged).
        seed: seed of the random votes and re-binarisations.
        ranks_per_node: group consecutive ranks into nodes of this size (default: the
            ``HVDCOMP_RANKS_PER_NODE`` environment variable, else MPI's shared-memory nodes).
        uneven: nodes with different numbers of ranks: 'flat' (default; fall back to one rank
            per node, with a warning) or 'error'.
        fusion, fusion_cost: LayerFusion bucketing, as for every hvdcomp compressor.
    """

    method = "BinSGDM"
    n_scalars = 0

    def __init__(self, *, betas=(0.9, 0.9), eps=1e-8, on_nonfinite="raise", seed=0,
                 ranks_per_node=None, uneven="flat", fusion=None, fusion_cost=None):
        super().__init__(min_compress_numel=0, on_nonfinite=on_nonfinite, seed=seed,
                         fusion=fusion, fusion_cost=fusion_cost)
        self.betas, self.eps = moment_constants(betas, eps)
        if ranks_per_node is not None and not (isinstance(ranks_per_node, numbers.Integral)
                                               and not isinstance(ranks_per_node, bool)
                                               and ranks_per_node >= 1):
            raise ValueError(f"ranks_per_node must be None or an int >= 1, got {ranks_per_node!r}")
        if uneven not in ("flat", "error"):
            raise ValueError(f"uneven must be 'flat' or 'error', got {uneven!r}")
        self.ranks_per_node, self.uneven = ranks_per_node, uneven
        self._hierarchy = None
        self.last_legs = None

    def hierarchy(self):
        """The node layout in use (built collectively on first use)."""
        ctx = self._context()
        if self._hierarchy is None or self._hierarchy.parent is not ctx:
            self._hierarchy = Hierarchy(ctx, self.ranks_per_node, self.uneven)
        return self._hierarchy

    def _prepare(self, entries):
        for e in entries:
            e.scratch = alg.update_moments(e.work, self.memory_like(e.key, e.work), *self.betas)
        return np.zeros((len(entries), 0))

    def _reduce(self, entries, scalars):
        ctx = self._context()
        hier = self.hierarchy()
        step, seed = self._step, self.seed
        with self._phase("encode"):
            like = entries[0].scratch[0]
            u = xp.concat([alg.direction(m, v, self.eps) for m, v in (e.scratch for e in entries)],
                          like=like)
            votes = xp.to_host(alg.binarise(u, self._keyed((seed, step, ctx.rank, alg.VOTE))))
            votes = votes.astype(small_int_dtype(hier.local_size), copy=False)

        def encode(node_sum, shard):
            key = self._keyed((seed, step, ctx.rank, alg.REBINARISE))
            return pack_signs(alg.rebinarise(node_sum, shard.node_size, key))

        def combine(messages, shard):
            bits = [unpack_signs(row, shard.size, "int8") for row in messages]
            return alg.node_votes_total(bits, shard.node_size, small_int_dtype(ctx.size))

        before = hier.leg_stats()
        with self._phase("comm"):
            total = hier.allreduce(votes, encode, combine, small_int_dtype(ctx.size))
        after = hier.leg_stats()
        self.last_legs = {k: after[k].since(before[k]) for k in after}
        out = []
        with self._phase("decode"):
            mean = alg.mean_vote(total, ctx.size, like=like)
            off = 0
            for e in entries:
                out.append(mean[off:off + e.numel])
                self._memory[e.key] = e.scratch
                off += e.numel
        return out

