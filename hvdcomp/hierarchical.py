"""Intra-node and inter-node stages for any method: ``wrap(method, mode)`` puts them around the
step engine's method contract (``prepare(batch) -> scalars``, ``reduce(batch, scalars) ->
means``), so a method written for one flat group of ranks runs hierarchically unchanged.

Where the job has several nodes with the same number L > 1 of ranks each (the layout of
``hvdcomp.comm.hierarchy.Hierarchy``: MPI's shared-memory nodes, or ``HVDCOMP_RANKS_PER_NODE``
ranks per node), one batch's compressed tensors are reduced in three stages:

1. intra reduce-scatter (in ``prepare``): every tensor of n elements is cut into L shards
   (``shard_bounds``, 8-element aligned so 1-bit messages of a shard are whole bytes); local rank
   r receives the node's exact float32 sum of shard r of every tensor (one fused exchange for the
   batch, summed in local-rank order) and divides it by L: its node's mean of that shard;
2. inter (``reduce``): the method itself, on those shards, among the ranks with the same local
   rank (one per node, ``Hierarchy.inter``): each node is one rank of the method, whose gradient
   is its node's mean, so the method returns the mean over all ranks of each shard. Its state
   (error feedback, ...) is per shard: kept under the tensor's name by the rank that owns the
   shard, shard-sized;
3. intra all-gather: every local rank's shard results (float32), concatenated per tensor.

The method's ``last_legs`` then holds what the last batch moved in each stage ({'intra',
'inter'}: ``CommStats``; ``last_stats`` counts both).

Every rank gets the same numbers: each shard's result is computed alike by its inter group (a
method's result is identical on the ranks of its group) and then copied. What leaves a node per
step is the method's traffic for n/L elements among N ranks, once per local rank: about the
method's traffic for n elements among N ranks (a 1-bit ring: 2 (N-1)/N bits per element), and
its sequential hops grow with N, not N*L. Inside the node each rank sends 2 (L-1)/L * 4n bytes
over shared memory, and encodes/decodes n/L elements instead of n.

One node, one rank per node, or nodes of different sizes (``Hierarchy``'s flat fallback): the
method runs flat over every rank, as without the wrapper (one machine: the compress-or-pass
decision then judges whether compressing pays). Methods whose paper prescribes their own stages
(BinSGDM: ``own_stages = True``) are not wrapped.

``mode``: 'auto' (default, or ``HVDCOMP_HIERARCHY``) as above; 'flat': never.
A tensor the decision passes after compressed steps adds its shard's memory to what it sends
(``carry``: owner rank, times L, so the mean over all ranks adds the mean over nodes of the
memories). A shard memory saved under another layout (a checkpoint from another node count) is
dropped with a warning and starts again from zero.
"""
import copy
import logging
import os

import numpy as np

from hvdcomp import feedback
from hvdcomp.backend import xp
from hvdcomp.comm.hierarchy import Hierarchy, shard_bounds
from hvdcomp.engine import Entry
from hvdcomp.frontends import adapter_for

MODES = ("auto", "flat")
DEFAULT_MODE = os.environ.get("HVDCOMP_HIERARCHY", "auto")
log = logging.getLogger("hvdcomp")


def wrap(method, mode):
    """The object the step engine calls for ``method``: ``method`` itself where ``mode`` is
    'flat' or the method has its own stages, else a ``Hierarchical`` around it."""
    if mode == "flat" or getattr(method, "own_stages", False):
        return method
    return Hierarchical(method)


class Hierarchical:
    """``method`` with intra-/inter-node stages (module docstring); the same contract as the
    method (``method``, ``n_scalars``, ``describe``, ``prepare``, ``reduce``, ``carry``)."""

    def __init__(self, method):
        self.inner = method
        self.method, self.n_scalars = method.method, method.n_scalars
        self.hierarchy = None  # the Hierarchy found at the first compressed batch
        self._rows = None
        # between prepare and reduce: (shard batch, per-tensor shard bounds, segment bounds of
        # the fused exchanges, each tensor's start in each segment, tensors with a shard here)
        self._pending = None

    def describe(self):
        return self.inner.describe()

    def layout(self, ctx):
        """The ``Hierarchy`` over ``ctx`` when the stages apply there, else None (collective
        the first time for each ``ctx``)."""
        if self.hierarchy is None or self.hierarchy.parent is not ctx:
            hier = Hierarchy(ctx)
            where = ctx.comm.allgather((hier.node, hier.local_rank))
            self._rows = [r for _, r in sorted((n, r) for r, (n, lr) in enumerate(where)
                                                if lr == hier.local_rank)]
            self.hierarchy = hier
            if ctx.rank == 0:
                log.info("%s: %s, %s", self.method, hier.describe(),
                         "intra-/inter-node stages" if self._staged() else "flat")
        return self.hierarchy if self._staged() else None

    def _staged(self):
        h = self.hierarchy
        return h.nodes > 1 and h.local_size > 1 and not h.flat_fallback

    def prepare(self, batch):
        hier = self.layout(batch.ctx)
        if hier is None:
            self._pending = None
            return self.inner.prepare(batch)
        L, r = hier.local_size, hier.local_rank
        self._legs_before = hier.leg_stats()
        bounds = [shard_bounds(e.numel, L) for e in batch.entries]
        host = [np.asarray(xp.to_host(e.work), dtype=np.float32).reshape(-1)
                for e in batch.entries]
        with batch.phase("comm"):
            send = np.concatenate([h[b[d]:b[d + 1]] for d in range(L) for h, b in
                                   zip(host, bounds)] or [np.zeros(0, np.float32)])
            sizes = np.array([[b[d + 1] - b[d] for d in range(L)] for b in bounds],
                             dtype=np.int64).reshape(len(bounds), L)
            starts = np.cumsum(sizes, axis=0) - sizes  # tensor i's place in segment d
            dest = np.concatenate([[0], np.cumsum(sizes.sum(axis=0))])
            starts += dest[:-1]
            node_mean = hier.reduce_scatter(send, dest)
            node_mean /= np.float32(L)
        shards, kept, off = [], [], 0
        for i, (e, b) in enumerate(zip(batch.entries, bounds)):
            n = b[r + 1] - b[r]
            if n:
                shards.append(_shard_entry(batch.store, e, node_mean[off:off + n]))
                kept.append(i)
            off += n
        inner = copy.copy(batch)
        inner.entries, inner.ctx = shards, hier.inter
        self._pending = (inner, bounds, dest, starts, kept)
        scalars = np.zeros((len(batch.entries), self.n_scalars))
        if shards:
            scalars[kept] = np.asarray(self.inner.prepare(inner), dtype=np.float64).reshape(
                len(shards), self.n_scalars)
        return scalars

    def reduce(self, batch, scalars):
        if self._pending is None:
            return self.inner.reduce(batch, scalars)
        (inner, bounds, dest, starts, kept), self._pending = self._pending, None
        hier, L = self.hierarchy, self.hierarchy.local_size
        parts = [np.zeros(0, np.float32)] * len(batch.entries)
        if kept:
            before = hier.inter.stats.snapshot()
            rows = np.asarray(scalars)[self._rows][:, kept]
            for i, out in zip(kept, self.inner.reduce(inner, rows)):
                parts[i] = np.asarray(xp.to_host(out), dtype=np.float32).reshape(-1)
            moved = hier.inter.stats.since(before)
            batch.ctx.stats.add(moved.bytes_sent, moved.bytes_recv, moved.messages)
        with batch.phase("comm"):
            full = hier.allgather(np.concatenate(parts), dest, np.float32)
        out = []
        for i, (e, b) in enumerate(zip(batch.entries, bounds)):
            flat = np.empty(e.numel, dtype=np.float32)
            for d in range(L):
                flat[b[d]:b[d + 1]] = full[starts[i, d]:starts[i, d] + b[d + 1] - b[d]]
            out.append(xp.from_host(flat, e.work))
        after = hier.leg_stats()
        self.inner.last_legs = {k: after[k].since(self._legs_before[k]) for k in after}
        return out

    def carry(self, store, entry, units=1.0):
        """``feedback.carry`` for a tensor whose memory is its shard's (module docstring)."""
        memory = store.get(entry.key)
        if memory is None or self.hierarchy is None or np.size(memory) == entry.numel:
            feedback.carry(store, entry, units)
            return
        L, r = self.hierarchy.local_size, self.hierarchy.local_rank
        b = shard_bounds(entry.numel, L)
        add = np.zeros(entry.numel, dtype=np.float32)
        if np.size(memory) == b[r + 1] - b[r]:
            add[b[r]:b[r + 1]] = np.asarray(xp.to_host(memory)).reshape(-1) * (units * L)
        entry.work = entry.work + xp.from_host(add, entry.work)
        store.drop(entry.key)


def _shard_entry(store, entry, shard):
    """An engine ``Entry`` for this rank's ``shard`` (float32 host array) of ``entry``: the same
    key (its state is the shard's), the user's Adam moments (``entry.adam``) kept. A memory of
    another size (saved under another layout) is dropped."""
    memory = store.get(entry.key)
    if memory is not None and not isinstance(memory, tuple) and np.size(memory) != shard.size:
        log.warning("hvdcomp: the state of %r was saved for another node layout (%d elements, "
                    "this rank's shard has %d): starting it from zero", entry.key,
                    np.size(memory), shard.size)
        store.discard(entry.key)
    made = Entry(entry.key, shard, adapter_for(shard), gradient=entry.gradient)
    made.adam = entry.adam
    return made
