"""Intra-node and inter-node stages for any method: ``wrap(method, mode)`` puts them around the
step engine's method contract (``prepare(batch) -> scalars``, ``reduce(batch, scalars) ->
means``), so a method written for one flat group of ranks runs hierarchically unchanged.

Where the job has several nodes with the same number L > 1 of ranks each (the layout of
``hvdcomp.comm.hierarchy.Hierarchy``: MPI's shared-memory nodes, or ``HVDCOMP_RANKS_PER_NODE``
ranks per node), one batch's compressed tensors are reduced in three stages:

1. intra reduce-scatter (in ``prepare``), through the node's shared memory
   (``hvdcomp.comm.hierarchy.NodeMemory``): every rank writes there the parts of its working
   vectors that the other local ranks sum (its own shard it reads from its gradient);
   every tensor of n elements is cut into L shards (``shard_bounds``, 8-element aligned so 1-bit
   messages of a shard are whole bytes), and local rank r sums shard r of every tensor over the
   node's ranks (float32, in local-rank order) and divides it by L: its node's mean of that shard;
2. inter (``reduce``): the method itself, on those shards, among the ranks with the same local
   rank (one per node, ``Hierarchy.inter``): each node is one rank of the method, whose gradient
   is its node's mean, so the method returns the mean over all ranks of each shard. Its state
   (error feedback, ...) is per shard: kept under the tensor's name by the rank that owns the
   shard, shard-sized;
3. intra all-gather: every local rank writes its shard results into the node's result vector in
   shared memory, and every rank copies it out.

The method's ``last_legs`` then holds what the last batch moved through MPI in each stage
({'intra', 'inter'}: ``CommStats``; the intra stages move nothing through MPI, only two
barriers); ``last_stats`` counts the inter stage.

Every rank gets the same numbers: each shard's result is computed alike by its inter group (a
method's result is identical on the ranks of its group) and then copied. What leaves a node per
step is the method's traffic for n/L elements among N ranks, once per local rank: about the
method's traffic for n elements among N ranks (a 1-bit ring: 2 (N-1)/N bits per element), and
its sequential hops grow with N, not N*L. Inside the node each rank writes 4n (L-1)/L bytes of
input and 4n/L of result to shared memory and reads 4n (L-1)/L of input and 4n of result, and
encodes/decodes n/L elements instead of n.

A method whose math needs a tensor's shape (PowerSGD's matrices: ``node_shares = 'tensors'``)
is given whole tensors instead of element shards: each tensor's node mean goes to one local
rank (``owners``: recorded in the state on every rank, so it stays put), which runs the method
on it among its inter group; its state is kept by that rank, whole-tensor-sized.

One node, one rank per node, nodes of different sizes (``Hierarchy``'s flat fallback), or a
"node" whose ranks share no memory (``HVDCOMP_RANKS_PER_NODE`` grouping other machines): the
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

from hvdcomp import feedback, validate
from hvdcomp.backend import xp
from hvdcomp.comm.hierarchy import Hierarchy, NodeMemory, shard_bounds
from hvdcomp.methods.contract import Entry

MODES = ("auto", "flat")
NODE_MEAN = "#node-mean"  # the store's scratch key suffix of a tensor's node mean shard
DEFAULT_MODE = os.environ.get("HVDCOMP_HIERARCHY", "auto")
log = logging.getLogger("hvdcomp")


def checked_mode(mode):
    """``mode`` (None: ``DEFAULT_MODE``) if it is one of ``MODES``, else ValueError."""
    return validate.choice("hierarchy", DEFAULT_MODE if mode is None else mode, MODES)


def node_layout(compressor):
    """The node layout ``compressor``'s last compressed batch found ('2 node(s) x 2 rank(s)';
    its stages run only where several nodes have several ranks), or None (none yet, or flat)."""
    hier = getattr(compressor.engine.method, "hierarchy", None)  # the wrapper's, or BinSGDM's
    return None if hier is None else hier.describe()


def wrap(method, mode):
    """The object the step engine calls for ``method``: ``method`` itself where ``mode`` is
    'flat' or the method has its own stages, else a ``Hierarchical`` around it."""
    if mode == "flat" or getattr(method, "own_stages", False):
        return method
    return Hierarchical(method)


class Hierarchical:
    """``method`` with intra-/inter-node stages (module docstring); the same contract as the
    method (``name``, ``n_scalars``, ``prepare``, ``reduce``; and ``carry_ready``, ``carry``)."""

    def __init__(self, method):
        self.inner = method
        self.name, self.n_scalars = method.name, method.n_scalars
        self.kernel_modules = getattr(method, "kernel_modules", ())
        self.whole = getattr(method, "node_shares", "elements") == "tensors"
        self.hierarchy = None  # the Hierarchy, found at the first compressed batch or carry
        # between prepare and reduce: (shard batch, per-tensor shard bounds, per-tensor offsets
        # in the node vectors, indices of the tensors with a shard on this rank)
        self._pending = None
        self._memory = None  # the node's NodeMemory (where the stages may apply)
        # whether the stages apply: several nodes of several ranks, each sharing its memory
        self._staged = False

    def layout(self, ctx):
        """The ``Hierarchy`` over ``ctx`` when the stages apply there, else None (collective
        the first time for each ``ctx``: the layout, and where the stages may apply, the
        node's shared memory and, unless MPI's shared-memory domains are the nodes, whether
        every node has it)."""
        if self.hierarchy is None or self.hierarchy.parent is not ctx:
            hier = Hierarchy(ctx)
            self._memory, self._staged = None, False
            if hier.nodes > 1 and hier.local_size > 1 and not hier.flat_fallback:
                self._memory = NodeMemory(hier.intra, hier.shares_memory)
                self._staged = (hier.shares_memory
                                or all(ctx.allgather_object(self._memory.usable)))
            self.hierarchy = hier
            if ctx.rank == 0:
                log.info("%s: %s, %s", self.name, hier.describe(),
                         "intra-/inter-node stages" if self._staged else "flat")
        return self.hierarchy if self._staged else None

    def prepare(self, batch):
        hier = self.layout(batch.ctx)
        if hier is None:
            self._pending = None
            return self.inner.prepare(batch)
        L, r, mem = hier.local_size, hier.local_rank, self._memory
        self._legs_before = hier.leg_stats()
        bounds = ([whole_bounds(e.numel, o, L) for e, o in zip(batch.entries, owners(batch, L))]
                  if self.whole else [shard_bounds(e.numel, L) for e in batch.entries])
        offsets = np.concatenate([[0], np.cumsum([e.numel for e in batch.entries])])
        mem.reserve(int(offsets[-1]))
        vectors = mem.inputs()
        hosts = [xp.to_host(e.work).reshape(-1) for e in batch.entries]
        for host, b, off in zip(hosts, bounds, offsets):  # the shards the other ranks sum
            lo, hi = off + b[r], off + b[r + 1]  # this rank's own shard, which it keeps
            vectors[r][off:lo] = host[:b[r]]
            vectors[r][hi:off + host.size] = host[b[r + 1]:]
        mem.barrier()  # every local rank's vector is in
        shards, kept, result = [], [], mem.result()
        for i, (e, host, b, off) in enumerate(zip(batch.entries, hosts, bounds, offsets)):
            lo, hi = off + b[r], off + b[r + 1]
            if hi > lo:  # this rank's own shard is read from its gradient, not written and read
                parts = [host[b[r]:b[r + 1]] if q == r else v[lo:hi]
                         for q, v in enumerate(vectors)]
                node_mean = np.add(parts[0], parts[1],
                                   out=batch.store.scratch(e.key + NODE_MEAN, parts[0]))
                for part in parts[2:]:
                    node_mean += part  # in local-rank order
                node_mean /= np.float32(L)
                if self.whole:  # the method sees the tensor's shape (PowerSGD's matrices)
                    node_mean = node_mean.reshape(e.shape)
                shards.append(_shard_entry(batch.store, e, node_mean, into=result[lo:hi]))
                kept.append(i)
        inner = copy.copy(batch)
        inner.entries, inner.ctx = shards, hier.inter
        self._pending = (inner, bounds, offsets, kept)
        scalars = np.zeros((len(batch.entries), self.n_scalars))
        if shards:
            scalars[kept] = np.asarray(self.inner.prepare(inner), dtype=np.float64).reshape(
                len(shards), self.n_scalars)
        return scalars

    def reduce(self, batch, scalars):
        if self._pending is None:
            return self.inner.reduce(batch, scalars)
        (inner, bounds, offsets, kept), self._pending = self._pending, None
        hier, mem, r = self.hierarchy, self._memory, self.hierarchy.local_rank
        result = mem.result()
        if kept:
            before = hier.inter.stats.snapshot()
            rows = scalars.then(lambda every: every[hier.peers][:, kept])
            for i, shard, out in zip(kept, inner.entries, self.inner.reduce(inner, rows)):
                if out is not shard.into:  # the method made its own array
                    shard.into[...] = xp.to_host(out).reshape(-1)
            moved = hier.inter.stats.since(before)
            batch.ctx.stats.add(moved.bytes_sent, moved.bytes_recv, moved.messages, moved.rounds)
        with batch.phase("comm"):
            mem.barrier()  # every shard's result is in
            out = [_copy_out(e, result[off:off + e.numel])
                   for e, off in zip(batch.entries, offsets)]
        after = hier.leg_stats()
        self.inner.last_legs = {k: after[k].since(self._legs_before[k]) for k in after}
        return out

    def carry_ready(self, ctx):
        """Before carrying memories, on every rank alike: the node layout, which places a shard
        memory (a compressor resumed from a checkpoint in a new process knows none before its
        first compressed batch)."""
        self.layout(ctx)

    def carry(self, store, entry):
        """``feedback.carry`` for a tensor whose memory is its shard's (module docstring)."""
        memory, owner = store.get(entry.key), store.get(entry.key + feedback.OWNER)
        if owner is not None:  # whole shares: recorded on every rank, the memory on the owner
            store.drop(entry.key + feedback.OWNER)
            L, lo, hi = int(owner[1]), 0, entry.numel
        elif memory is None or self.hierarchy is None or np.size(memory) == entry.numel:
            feedback.carry(store, entry)
            return
        else:
            L, r = self.hierarchy.local_size, self.hierarchy.local_rank
            lo, hi = shard_bounds(entry.numel, L)[r:r + 2]
        if memory is None:
            return
        add = np.zeros(entry.numel, dtype=np.float32)
        if np.size(memory) == hi - lo:
            add[lo:hi] = np.asarray(xp.to_host(memory)).reshape(-1) * np.float32(L)
        else:  # a shard of another layout (a checkpoint from other nodes)
            log.warning("hvdcomp: the memory of %r was saved for another node layout (%d "
                        "elements, here %d): dropped", entry.key, np.size(memory), hi - lo)
        entry.work = entry.work + xp.from_host(add, entry.work)
        store.drop(entry.key)


def owners(batch, local_size):
    """Whole-tensor shares: the local rank that reduces each of ``batch``'s tensors. A tensor
    keeps the owner recorded in the state (``'<name>#owner'``: ``[owner, ranks per node]``, the
    same on every rank, saved in checkpoints, dropped when the tensor is passed:
    ``Hierarchical.carry``); one without goes to the local rank with the fewest elements among
    the batch's tensors so far (the first such), and that is recorded. So the memory stays with
    its owner whatever else the batch holds. A record of another node size (a checkpoint from
    another layout) is replaced, and its memory dropped with a warning."""
    known = []
    for e in batch.entries:
        record = batch.store.get(e.key + feedback.OWNER)
        if record is not None and int(record[1]) != local_size:
            log.warning("hvdcomp: the state of %r was saved for nodes of %d ranks (now %d): "
                        "starting it from zero", e.key, int(record[1]), local_size)
            batch.store.discard(e.key)
            record = None
        known.append(None if record is None else int(record[0]))
    load = [0] * local_size
    for e, o in zip(batch.entries, known):
        if o is not None:
            load[o] += e.numel
    out = []
    for e, o in zip(batch.entries, known):
        if o is None:
            o = load.index(min(load))
            load[o] += e.numel
            batch.store.put(e.key + feedback.OWNER, np.array([o, local_size], dtype=np.int64))
        out.append(o)
    return out


def whole_bounds(numel, owner, local_size):
    """The share bounds (as ``shard_bounds``'s) that give a tensor of ``numel`` elements whole
    to local rank ``owner``."""
    return [0] * (owner + 1) + [numel] * (local_size - owner)


def _copy_out(entry, values):
    """``entry``'s result: ``values`` (a view of the node's shared result) copied into the
    user's gradient where the entry may write there (``Entry.into``), else into a new array."""
    if entry.into is not None and entry.into.dtype == values.dtype:
        entry.into[...] = values
        return entry.into
    return xp.from_host(values.copy(), entry.work)


def _shard_entry(store, entry, shard, into):
    """A method's ``Entry`` for this rank's ``shard`` (float32 host array) of ``entry``: the same
    key (its state is the shard's), the user's Adam moments (``entry.adam``) kept, its result
    to be written ``into`` the node's shared result where the method can. A memory of another
    size (saved under another layout) is dropped."""
    memory = store.get(entry.key)
    if memory is not None and not isinstance(memory, tuple) and np.size(memory) != shard.size:
        log.warning("hvdcomp: the state of %r was saved for another node layout (%d elements, "
                    "this rank's shard has %d): starting it from zero", entry.key,
                    np.size(memory), shard.size)
        store.discard(entry.key)
    return Entry(entry.key, shard.reshape(-1), shard.shape, gradient=entry.gradient,
                 adam=entry.adam, into=into)
