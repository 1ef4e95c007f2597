"""``hvdcomp.BinSGDM``: one-bit momentum (Birder) over a hierarchical 1-bit all-reduce
(math in ``hvdcomp.methods.binsgdm.math``, stages in ``hvdcomp.comm.hierarchy``).

The compressor carries the momentum. ``decompress`` returns the mean over ranks of the ±1 votes
(values in [-1, 1], multiples of 1/nodes, or of 1/size on a single node; for a tensor the
compress-or-pass decision passes, which its default 'measure' does first, their expectation:
"steps aside" below) scaled for the user's optimizer, so the user keeps their optimizer and its
learning rate:

- plain SGD without momentum: the mean vote times ``s``, the ranks' mean of the tensor's mean
  normaliser ``v`` (the running mean of |g|; one float per tensor rides the scalars' all-gather),
  so the step has the gradient's scale and SGD's usual rate applies (recipe (a), the digits MLP
  at lr 0.1: 0.958 against uncompressed 0.962, 3 seeds; with the bare mean vote, SGD's lr 0.1
  moved every coordinate by up to 0.1 per step and diverged);
- Adam/AdamW (torch or Keras): the mean vote times ``c`` in [1, sqrt(size)], clipped to
  [-1, 1], and hvdcomp sets Adam's moments so that Adam's update is ``lr`` times it
  (``hvdcomp.preconditioning.ThroughAdam``): Adam's usual rates. Each rank's vote is normalised
  by its own gradient, Adam by the ranks' mean gradient, smaller where the ranks' gradients are
  noise; ``c`` is one over the root mean square of the ranks' mean normalised gradient ``g / v``
  at 16 positions per tensor, which every rank sends beside its scalars (``alg.adam_scale``);
- SGD with momentum: as plain SGD, with BinSGDM's own momentum shortened to ``b1 <= 0.5``
  (``UNDER_MOMENTUM_B1``), since two momenta in a row lag: recipe (b) (the digits CNN, SGD lr
  0.05, momentum 0.9, cosine), 3 seeds, 0.972 against uncompressed 0.977 (b1 0.9 kept: 0.88;
  b1 0: 0.964);
- anything else is refused at the first step (``hvdcomp.checks.inner_optimizer``);
- a direct ``hvd.allreduce`` (no optimizer): the mean vote.

SGD's ``weight_decay`` (or AdamW's) then gives the decoupled update ``x -= lr * (step + wd * x)``::

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=wd),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcomp.BinSGDM)

No warm-up, no error feedback. Where the compress-or-pass decision passes a tensor (a fast wire:
``hvdcomp.decision``), BinSGDM steps aside (``hvdcomp.stepaside``): each rank sends its direction
``u = clip(m / v)`` and its ``mean(v)`` uncompressed, through Horovod's own allreduce (which
overlaps the backward pass) under SGD, and the step is the mean ``u`` (times the mean scale under
SGD): the expectation of the voted step, its moments the rank's own as in a voted step, so a
tensor that switches loses nothing.

One rank: the compressor then moves nothing and returns the rank's own votes, but Horovod's torch
``DistributedOptimizer`` calls no compressor at all when ``size() == 1`` (it registers its hooks
only for size > 1 or with ``HOROVOD_ELASTIC=1``), so without that variable a 1-rank run is plain
SGD on raw gradients (tested in tests/test_binsgdm.py).

Per flush all gradients (of any size: small tensors are binarised too, so every parameter gets
the same update rule) are fused into one vector of d votes. Wire, per rank, with L ranks per
node and N nodes: inside the node the votes go out as packed bits (``d (L-1) / (8 L)`` bytes
scattered: each shard's owner counts its node's votes from the L ranks' bits); between nodes,
with two nodes, ``d / (8 L)`` bytes: each node's 1 bit per element to the other; with N >= 3
nodes the nodes' bits are merged along a ring of the N ranks with this local rank, as Marsit
merges ranks' bits (an incoming bit that aggregates k nodes is kept with probability k/(k+1),
so each final bit is that of a node drawn uniformly and ``N L`` times it estimates the sum
without bias): ``2 (N-1) / N * d / (8 L)`` bytes, so a node sends under 2 bits per element
however many nodes there are (an all-gather would send N-1); the price is resolution (the
estimate is +-size, where the all-gather's is a multiple of L). Back inside the node, the
nodes' (or the merged) bits of every shard (``R d (L-1) / (8 L)`` bytes gathered, R = 2 rows,
or 1 merged; each rank forms the totals itself) while that is less than the totals themselves
(``d (L-1) / L`` bytes as int8 when size <= 127), else the totals. Per-step figures
by leg: ``last_legs`` ({'intra', 'inter'}: CommStats); the totals are in ``last_stats`` as for
every compressor.

State per tensor: ``(m, v)`` (float32, like the working gradient; ``s`` is computed from ``v``
and the gradient each step, not kept), checkpointed by
``state_dict()``; the random votes are keyed by (seed, step, rank), so a resumed run repeats the
uninterrupted one bit for bit.
"""
import numpy as np

from hvdcomp import kernels, stepaside, validate
from hvdcomp.methods.binsgdm import math as alg
from hvdcomp.algorithms import moment_constants
from hvdcomp.signs.merge import MarsitMerge
from hvdcomp.backend import pack_signs, unpack_signs
from hvdcomp.methods.binsgdm import stochastic
from hvdcomp.backend import xp
from hvdcomp.backend.bits import packed_nbytes
from hvdcomp.comm.hierarchy import Hierarchy, small_int_dtype
from hvdcomp.methods.contract import Method

KERNELS = "hvdcomp.methods.binsgdm.kernels"  # its fused kernels (hvdcomp.kernels.warm)


UNDER_MOMENTUM_B1 = 0.5  # BinSGDM's own b1 at most, under the user's SGD momentum


class BinSGDM(Method):
    """BinSGDM for ``hvd.DistributedOptimizer(SGD(...), compression=hvdcomp.BinSGDM)`` (or the
    user's Adam/AdamW), at the optimizer's usual learning rate.

    Args:
        betas: ``(b1, b2)``: momentum ``m = b1 m + (1-b1) g`` and normaliser
            ``v = b2 v + (1-b2) |g|``. Default (0.9, 0.9): with equal betas ``|m| <= v``, so
            ``u = m / v`` is in [-1, 1] without clipping, with no bias to correct (the state
            starts at m = g, v = |g|); a slower normaliser (e.g. 0.999) is allowed and clipped.
            See ``hvdcomp.methods.binsgdm.math``.
        eps: added to ``v`` (guards coordinates whose gradient has always been 0).
        ranks_per_node: group consecutive ranks into nodes of this size (default: the
            ``HVDCOMP_RANKS_PER_NODE`` environment variable, else MPI's shared-memory nodes).
        uneven: nodes with different numbers of ranks: 'flat' (default; fall back to one rank
            per node, with a warning) or 'error'.
        seed: seed of the random votes and re-binarisations.
        on_nonfinite, fusion, fusion_cost: as for every hvdcomp compressor (a skipped step
            returns zeros and leaves (m, v) unchanged), and ``decision``: where it passes a
            tensor, BinSGDM steps aside (``hvdcomp.stepaside``): each rank sends its direction
            ``clip(m / v)`` uncompressed (through Horovod's own allreduce where it can), whose
            mean is the expectation of the mean vote. Every tensor is a candidate (no
            ``min_compress_numel``: small tensors are voted on too, so every parameter gets the
            same update rule), and BinSGDM takes no ``precondition``: it is itself the
            optimizer, with its own momentum and its own per-coordinate normaliser.
    """

    name = "BinSGDM"
    under_adam = "step"  # it is the optimizer itself (preconditioning.ThroughAdam)
    own_stages = True  # its paper's intra-node votes (hvdcomp.comm.hierarchy), not the wrapper's
    returns_step = "BinSGDM"  # its result is the step itself (hvdcomp.methods.contract.Method)
    refused = ("min_compress_numel", "precondition")
    refusal = "every tensor is a candidate, and BinSGDM carries its own momentum and normaliser"
    fixed = {"min_compress_numel": 0}
    # the tensor's mean normaliser (the step's scale under SGD); for a batch under the user's
    # Adam, 1 + alg.SAMPLES: then the normalised gradient at the sampled positions (prepare)
    n_scalars = 1
    kernel_modules = (KERNELS,)  # loaded by its constructor: its moments run on every step

    def __init__(self, *, betas=(0.9, 0.9), eps=1e-8, ranks_per_node=None, uneven="flat"):
        self.betas, self.eps = moment_constants(betas, eps)
        self.betas_in_use = self.betas  # (b1, b2) for the user's optimizer (under_sgd_momentum)
        self.ranks_per_node = validate.optional_count("ranks_per_node", ranks_per_node, 1)
        self.uneven = validate.choice("uneven", uneven, ("flat", "error"))
        self.hierarchy = None  # the node layout in use (``layout``)
        # per tensor key, (v, its total) as the fused kernels summed it when they wrote that v:
        # the next step's scale reads the total instead of v (``committed_total``)
        self.v_totals = {}
        kernels.warm(KERNELS)

    def settings(self):
        return {"betas": list(self.betas), "eps": self.eps, "ranks_per_node": self.ranks_per_node,
                "uneven": self.uneven}

    def under_sgd_momentum(self, momentum):
        """Under the user's SGD momentum BinSGDM's own momentum is shortened to ``b1 <=
        UNDER_MOMENTUM_B1`` (the two in a row otherwise lag: module docstring)."""
        b1 = min(self.betas[0], UNDER_MOMENTUM_B1) if momentum else self.betas[0]
        self.betas_in_use = (b1, self.betas[1])
        return True

    def layout(self, ctx):
        """The node layout over ``ctx`` (built collectively on first use, and for a new ctx)."""
        if self.hierarchy is None or self.hierarchy.parent is not ctx:
            self.hierarchy = Hierarchy(ctx, self.ranks_per_node, self.uneven)
        return self.hierarchy

    def exact_parts(self, work, key, store, out):
        """Where the decision passes a tensor (``hvdcomp.stepaside``): writes into ``out`` the
        direction ``u = clip(m / v)`` of this rank's moments of tensor ``key`` (in ``store``)
        updated by ``work``, of which the votes are unbiased draws (so the mean over ranks of
        ``u`` is the expectation of the mean vote); returns the scale ``s = mean(v)``
        (``normaliser_mean``: the step's scale under SGD) and the new moments, as its compressed
        step would update them (one fused pass on host arrays, ``FusedPath``)."""
        b1, b2 = self.betas_in_use
        if kernels.active(KERNELS, work, out):
            from hvdcomp.methods.binsgdm import kernels as kv
            m, v = store.get(key) or (None, None)
            moments = tuple(store.spare(key, work, part) for part in (0, 1))
            v_total = kv.moments_direction(work, m, v, *_constants(work, (b1, b2), self.eps),
                                           *moments, out, np.empty(alg.LANES))
            self.v_totals[key] = (moments[1], v_total)
        else:
            moments = alg.update_moments(work, store.get(key, like=work), b1, b2)
            out[...] = alg.direction(*moments, self.eps)
            v_total = alg.total(moments[1])
        return v_total / max(int(work.shape[0]), 1), moments

    def adam_samples(self, work, key, store):
        """Under the user's Adam: what a rank sends beside its votes or its direction, its
        gradient ``work`` (flat) of tensor ``key`` over its normaliser after it (state in
        ``store``) at ``alg.sample_positions`` (``alg.SAMPLES`` float64 values)."""
        return alg.normalised_samples(work, store.get(key), self.betas_in_use[1], self.eps,
                                      alg.sample_positions(int(work.shape[0])))

    @staticmethod
    def adam_step(step, mean_samples, size, bound=1.0):
        """``step`` (the mean vote, or the mean direction, flat) under the user's Adam: times
        ``alg.adam_scale`` of the ranks' mean ``adam_samples`` over ``size`` ranks, clipped to
        [-bound, bound], in place; returns it."""
        scale = alg.adam_scale(mean_samples, min(int(step.shape[0]), alg.SAMPLES), size)
        if scale == 1.0:
            return step
        return xp.clip_(xp.multiply(step, scale, out=step), bound)

    def committed_total(self, key, v):
        """``alg.total(v)`` of tensor ``key``'s committed normaliser ``v``: the total the fused
        kernels summed as they wrote this very array (``v_totals``; each write into an array
        records its new total, so a recorded array holds what was summed), else summed now."""
        recorded = self.v_totals.get(key)
        return recorded[1] if recorded is not None and recorded[0] is v else alg.total(v)

    def prepare(self, batch):
        adam = any(e.adam is not None for e in batch.entries)
        self.n_scalars = 1 + alg.SAMPLES if adam else 1
        rows = np.zeros((len(batch.entries), self.n_scalars))
        for row, e in zip(rows, batch.entries):
            if stepaside.under_sgd(e):
                state = batch.store.get(e.key)
                row[0] = alg.normaliser_mean(
                    e.work, state, self.betas_in_use[1],
                    None if state is None else self.committed_total(e.key, state[1]))
            elif e.adam is not None:
                row[1:] = self.adam_samples(e.work, e.key, batch.store)
        return rows

    def reduce(self, batch, scalars):
        ctx, hier = batch.ctx, self.layout(batch.ctx)
        # the votes and the mean follow the gradients (host arrays: fused kernels; tensors on a
        # device: array operations there); the inter-node stages work on host arrays
        path = (FusedPath if kernels.active(KERNELS, *(e.work for e in batch.entries))
                else ReferencePath)
        host = FusedPath if kernels.on(KERNELS) else ReferencePath
        with batch.phase("encode"):
            votes = path.votes(batch, self.betas_in_use, self.eps,
                               batch.key(self.seed, batch.step, ctx.rank, alg.VOTE),
                               self.v_totals)
            votes = votes.astype(small_int_dtype(hier.local_size), copy=False)

        def encode(node_sum, shard):
            key = batch.key(self.seed, batch.step, ctx.rank, alg.REBINARISE)
            return host.rebinarised(node_sum, shard.node_size, key)

        total_dtype = small_int_dtype(ctx.size)
        # 3+ nodes: the nodes' bits merged along a ring (module docstring); ``combine`` then
        # gets one row standing for all N nodes, weighted N L
        merge = MarsitMerge(self.seed, batch.step, hier.node, (batch.index, hier.local_rank))
        rows = hier.message_rows(merge)

        def combine(messages, shard):
            weight = shard.node_size * shard.nodes // len(messages)
            return host.vote_sums(messages, shard.size, weight, total_dtype)

        def node_sum(rows, count):  # the local ranks' packed votes, summed
            return host.vote_sums(rows, count, 1, votes.dtype)

        before = hier.leg_stats()
        with batch.phase("comm"):
            # intra: votes out as bits; back, the nodes' (or merged) bits instead of the totals
            # while that is less (rows bits against 8 bits per byte of the totals' dtype)
            fewer = rows < 8 * total_dtype.itemsize
            total = hier.allreduce(votes, encode, combine, total_dtype,
                                   intra_wire=(pack_votes, node_sum),
                                   message_nbytes=packed_nbytes if fewer else None, merge=merge)
        after = hier.leg_stats()
        self.last_legs = {k: after[k].since(before[k]) for k in after}
        out, off = [], 0
        with batch.phase("decode"):
            for i, e in enumerate(batch.entries):
                # under SGD the vote times the ranks' mean v
                scale = (float(np.sum(scalars[:, i, 0]) / ctx.size) if stepaside.under_sgd(e)
                         else None)
                step = path.mean(total[off:off + e.numel], ctx.size, e, scale)
                if e.adam is not None:
                    step = self.adam_step(step, np.sum(scalars[:, i, 1:], axis=0) / ctx.size,
                                          ctx.size)
                out.append(step)
                batch.store.put(e.key, e.moments)
                off += e.numel
        return out


def pack_votes(votes):
    """±1 votes (integer, host) as packed bits (bit 1 for +1), the intra-node wire format."""
    return np.packbits(votes > 0)


class ReferencePath:
    """BinSGDM's step in array operations (NumPy, or Torch on any device): the definition
    (``hvdcomp.methods.binsgdm.math``) that ``FusedPath`` reproduces bit for bit."""

    @staticmethod
    def votes(batch, betas, eps, key, v_totals):
        """Sets every entry's new ``moments``; returns the batch's votes (host int8, fused in
        entry order). ``v_totals``: ``BinSGDM.v_totals``, which the fused path records into."""
        for e in batch.entries:
            e.moments = alg.update_moments(e.work, batch.store.get(e.key, like=e.work), *betas)
        u = xp.concat([alg.direction(m, v, eps) for m, v in (e.moments for e in batch.entries)],
                      like=batch.entries[0].work)
        return xp.to_host(alg.binarise(u, key))

    @staticmethod
    def rebinarised(node_sum, node_size, key):
        """A node's sum re-binarised and packed (the inter-node message)."""
        return pack_signs(alg.rebinarise(node_sum, node_size, key))

    @staticmethod
    def vote_sums(rows, count, weight, dtype):
        """``weight`` times the sum of the ±1 votes packed in the ``rows`` (uint8, one per rank
        or node, ``count`` votes each), in ``dtype``: a node's sum of its ranks' votes
        (weight 1), or from the nodes' messages the estimate of the sum over all ranks (weight:
        the node size)."""
        bits = [unpack_signs(row, count, "int8") for row in rows]
        return alg.node_votes_total(bits, weight, dtype)

    @staticmethod
    def mean(total, size, entry, scale):
        """``entry``'s step, the mean vote ``total / size`` (float32, like its ``work``) of its
        slice ``total`` of the vote totals, times ``scale`` (a float, or None: 1)."""
        step = alg.mean_vote(total, size, like=entry.work)
        if scale is not None:
            xp.multiply(step, scale, out=step)
        return step


PROBABILITIES = "#p"  # the store's scratch key of the vote probabilities of a block of elements
VOTES = "#votes"  # the store's scratch key of a batch's votes (with the batch index)


def _constants(like, betas, eps):
    """The kernels' constants ``b1, 1 - b1, b2, 1 - b2, eps`` in ``like``'s float dtype (the
    reference's: each rounded from the Python float)."""
    dtype = like.dtype.type
    return [dtype(c) for c in (betas[0], 1 - betas[0], betas[1], 1 - betas[1], eps)]


def _words32(key):
    """The random stream's two words for ``key`` as the kernels take them (uint32)."""
    return [np.uint32(w) for w in stochastic.words(key)]


class FusedPath:
    """``ReferencePath`` by the fused kernels of ``hvdcomp.methods.binsgdm.kernels`` (host float arrays):
    the same numbers, one pass each."""

    @staticmethod
    def votes(batch, betas, eps, key, v_totals):
        from hvdcomp.methods.binsgdm import kernels as kv
        dtype = batch.entries[0].work.dtype.type
        consts = _constants(batch.entries[0].work, betas, eps)
        words = _words32(key)
        out = batch.store.scratch_bytes(f"{VOTES}{batch.index}",
                                        sum(e.numel for e in batch.entries)).view(np.int8)
        block = batch.store.scratch_bytes(
            PROBABILITIES, kv.PROBABILITY_BLOCK * np.dtype(dtype).itemsize).view(dtype)
        off, lanes = 0, np.empty(alg.LANES)
        for e in batch.entries:
            m, v = batch.store.get(e.key) or (None, None)
            e.moments = tuple(batch.store.spare(e.key, e.work, part) for part in (0, 1))
            v_totals[e.key] = (e.moments[1], kv.moments_votes(
                e.work, m, v, *consts, *words, off, *e.moments, block, out, lanes))
            off += e.numel
        return out

    @staticmethod
    def rebinarised(node_sum, node_size, key):
        from hvdcomp.methods.binsgdm import kernels as kv
        packed = np.empty(packed_nbytes(node_sum.shape[0]), dtype=np.uint8)
        kv.rebinarise_packed(np.ascontiguousarray(node_sum), node_size,
                             kv.rebinarise_thresholds(node_size), *_words32(key), packed)
        return packed

    @staticmethod
    def vote_sums(rows, count, weight, dtype):
        from hvdcomp.methods.binsgdm import kernels as kv
        out = np.empty(count, dtype=dtype)
        kv.node_totals(np.ascontiguousarray(rows), count, weight, out)
        return out

    @staticmethod
    def mean(total, size, entry, scale):
        """Written into the user's gradient where allowed (the votes were drawn from it: it is
        read no more, ``hvdcomp.engine.Entry.result_buffer``), the scale applied in the same
        pass (in the step's dtype, as the reference's multiply)."""
        from hvdcomp.methods.binsgdm import kernels as kv
        out = entry.result_buffer(entry.work, done_reading=True)
        kv.mean_vote(np.ascontiguousarray(total), size,
                     out.dtype.type(1.0 if scale is None else scale), out)
        return out
