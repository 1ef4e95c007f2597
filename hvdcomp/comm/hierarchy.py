"""Two-level all-reduce stages: an exact reduce inside each node, a compressed exchange between
nodes, and a gather back inside the node. Algorithm-free: the method passes its own ``encode``
and ``combine`` functions for the inter-node leg.

Topology (built once, collectively, by ``Hierarchy(ctx)``):

- Node assignment, first that applies: the ``ranks_per_node`` argument; the environment variable
  ``HVDCOMP_RANKS_PER_NODE`` (both group consecutive ranks: node = rank // k, so one machine can
  pose as several nodes in tests); else MPI's shared-memory domains
  (``Split_type(COMM_TYPE_SHARED)``), nodes numbered by their lowest rank.
- ``intra``: the ranks of one node, ordered by rank (``local_rank``); ``inter``: the ranks with
  the same local rank, one per node, ordered by node. Both are ``CommContext``s with their own
  ``CommStats``, so the two legs are counted apart; every count also goes to the parent
  context's counters (the compressor's per-step totals).
- Nodes with different numbers of ranks: ``uneven='flat'`` (default) falls back to treating
  every rank as a node of one rank (correct, with no intra-node stage: every rank sends its 1-bit
  message to every other rank); rank 0 warns with ``HierarchyWarning`` naming the node sizes.
  ``uneven='error'`` raises ``HierarchyError`` naming them, on every rank.
- One node: the inter-node stage is skipped and the result is the exact sum. One rank per node:
  the intra stages move nothing.

``allreduce(x, encode, combine, out_dtype)`` on a 1-D array ``x`` (same length n and dtype on
every rank; integer or float; its dtype must hold the sum over one node, see
``small_int_dtype``):

1. intra reduce-scatter: the n elements are cut into ``local_size`` shards (aligned to ``align``
   elements, so 1-bit messages of shards are whole bytes); each rank sends every other local
   rank that rank's shard of ``x`` and sums the ``local_size`` contributions to its own shard,
   in local-rank order: ``node_sum`` (dtype of ``x``).
2. inter exchange (more than one node): ``encode(node_sum, shard) -> uint8 message`` (its length
   must depend only on the shard's length); the ranks of ``inter`` all-gather their messages;
   ``combine(messages, shard)`` gets them as a (nodes, nbytes) uint8 array in node order and
   returns the shard's estimate of the sum over all ranks. With ``merge`` (a per-hop combine of
   ``hvdcomp.comm.ring``'s contract for packed messages, e.g. Marsit's unbiased bit merge) and
   three or more nodes, the messages are instead merged along a ring of the ``inter`` ranks
   (reduce-scatter with ``merge``, all-gather unchanged) and ``combine`` gets one row that
   stands for every node (``message_rows``): each node then sends 2 (N-1)/N of a message
   instead of N-1 of them, so its traffic stays flat as nodes are added. (With two nodes the
   ring moves what the all-gather moves, so the exact all-gather is kept.) With one node the
   shard's result is ``node_sum`` itself.
3. intra all-gather of the shards' results, cast to ``out_dtype`` (default: ``x``'s dtype);
   or, with ``message_nbytes``, of the shards' nodes' messages, every rank then combining every
   shard itself.

The result (the sum over all ranks, estimated through ``combine`` when there are several nodes)
is identical on every rank: each shard is computed by one rank per node from the same
all-gathered messages, deterministically, and then copied.

Traffic per rank (itemsize b of ``x``, c of ``out_dtype``, L ranks per node, N nodes, shard
~ n/L elements, B(k) message bytes for k elements):
intra ``(L-1)/L * n * b`` (reduce-scatter; with ``intra_wire``, its packed bytes instead) +
``(L-1) * shard * c`` (gather; with ``message_nbytes``, ``(L-1) * N * B(shard)``);
inter ``(N-1) * B(shard)`` (with ``merge`` and N > 2: ``2 (N-1)/N * B(shard)``, to chunk
rounding); for 1-bit messages each node sends its n bits to every other node (merged: about 2n
bits in all, whatever N).
"""
import dataclasses
import os
import time
import warnings

import numpy as np

from hvdcomp.comm.context import CommContext, free_at_exit, free_now
from hvdcomp.comm.ring import _exchange, chunk_bounds, ring_allreduce
from hvdcomp.comm.stats import CommStats
from hvdcomp.errors import HvdcompError

ENV_RANKS_PER_NODE = "HVDCOMP_RANKS_PER_NODE"


class HierarchyError(HvdcompError):
    """The node layout cannot be used (e.g. nodes with different numbers of ranks)."""


class HierarchyWarning(UserWarning):
    """The hierarchy fell back to a flat layout."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """The element range ``[start, stop)`` this rank owns inside its node."""
    start: int
    stop: int
    owner: int       # local rank owning the shard (this rank)
    node: int        # this rank's node index
    node_size: int   # ranks per node (the same on every node)
    nodes: int

    @property
    def size(self):
        return self.stop - self.start


def small_int_dtype(bound):
    """The narrowest signed integer dtype holding every value in [-bound, bound]."""
    for dt in (np.int8, np.int16, np.int32, np.int64):
        if bound <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"no integer dtype holds +-{bound}")


def merges(nodes):
    """Whether ``Hierarchy.allreduce`` merges the nodes' messages along a ring when given a
    ``merge`` (3 nodes or more; with 2 the all-gather moves as many bits, exactly)."""
    return nodes > 2


def shard_bounds(n, parts, align=8):
    """Start offsets of ``parts`` nearly equal shards of ``n`` elements whose boundaries are
    multiples of ``align`` (the last shard takes the remainder), plus ``n`` at the end."""
    units = -(-int(n) // align)
    return [min(b * align, int(n)) for b in chunk_bounds(units, parts)]


def _ranks_per_node(arg):
    value = arg if arg is not None else os.environ.get(ENV_RANKS_PER_NODE) or None
    if value is None:
        return None
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        source = "ranks_per_node" if arg is not None else ENV_RANKS_PER_NODE
        raise HierarchyError(f"{source} must be a positive integer, got {value!r}")
    return k


def _node_of_ranks(ctx, ranks_per_node):
    """``(node index of every rank, domain)``: the list is identical on every rank (a
    collective); ``domain`` is this rank's shared-memory communicator
    (``Split_type(COMM_TYPE_SHARED)``, its ranks ordered as in ``ctx``) where the nodes are
    MPI's shared-memory domains, else None (``ranks_per_node`` groups consecutive ranks). A
    node's leader is its lowest rank, found through the domain's group (local), so the nodes
    cost one split and one all-gather."""
    if ranks_per_node is not None:
        return [r // ranks_per_node for r in range(ctx.size)], None
    if hasattr(ctx.comm, "node_of_ranks"):  # a transport that knows its nodes (torchrun's)
        return ctx.comm.node_of_ranks(), None
    from mpi4py import MPI
    domain = ctx.comm.Split_type(MPI.COMM_TYPE_SHARED, key=ctx.rank)
    mine, world = domain.Get_group(), ctx.comm.Get_group()
    leader = MPI.Group.Translate_ranks(mine, [0], world)[0]
    mine.Free()
    world.Free()
    leaders = ctx.comm.allgather(leader)
    order = sorted(set(leaders))
    return [order.index(lead) for lead in leaders], domain


class Hierarchy:
    """Intra- and inter-node communicators over ``ctx`` (a collective constructor: every rank
    of ``ctx`` builds it at the same point). See the module docstring.

    Attributes: ``nodes``, ``node``, ``local_size``, ``local_rank``, ``node_sizes`` (the sizes
    found, before any fallback), ``flat_fallback`` (True when uneven nodes were flattened),
    ``intra``/``inter`` (``CommContext``s with per-leg ``stats``), ``peers`` (the ranks of
    ``ctx`` in this rank's ``inter`` group, in node order), ``shares_memory`` (True where
    ``intra`` is MPI's shared-memory domain; None where the nodes were given). Built with two
    splits (the domain and ``inter``) and one all-gather where MPI finds the nodes.
    """

    def __init__(self, ctx, ranks_per_node=None, uneven="flat", align=8):
        if uneven not in ("flat", "error"):
            raise ValueError(f"uneven must be 'flat' or 'error', got {uneven!r}")
        self.parent, self.align = ctx, int(align)
        node_of, domain = _node_of_ranks(ctx, _ranks_per_node(ranks_per_node))
        members = {}
        for r, n in enumerate(node_of):
            members.setdefault(n, []).append(r)
        self.node_sizes = [len(members[n]) for n in sorted(members)]
        self.flat_fallback = len(set(self.node_sizes)) > 1
        if self.flat_fallback:
            layout = "; ".join(f"node {n}: ranks {members[n]}" for n in sorted(members))
            msg = (f"hvdcomp hierarchy: nodes have different numbers of ranks, node sizes "
                   f"{self.node_sizes} ({layout})")
            if uneven == "error":
                raise HierarchyError(msg + "; the hierarchical all-reduce needs the same number "
                                     "of ranks on every node (pass uneven='flat' to fall back to "
                                     "one rank per node)")
            if ctx.rank == 0:
                warnings.warn(msg + "; falling back to one rank per node (no intra-node stage)",
                              HierarchyWarning, stacklevel=2)
            node_of = list(range(ctx.size))
        self.node = node_of[ctx.rank]
        self.nodes = len(set(node_of))
        self.local_size = ctx.size // self.nodes
        seen, local_rank = {}, []
        for n in node_of:  # each rank's place among its node's ranks, in rank order
            local_rank.append(seen.get(n, 0))
            seen[n] = local_rank[-1] + 1
        self.local_rank = local_rank[ctx.rank]
        # the ranks of this rank's inter group (one per node, the same local rank), node order
        self.peers = sorted((r for r in range(ctx.size) if local_rank[r] == self.local_rank),
                            key=node_of.__getitem__)
        # whether the ranks of ``intra`` share memory: True where it is the domain itself;
        # None where the nodes were given (``ranks_per_node``): NodeMemory finds out
        self.shares_memory = True if domain is not None and not self.flat_fallback else None
        if self.shares_memory:
            intra = domain  # the node's ranks in ctx's order: what the split would give
        else:
            if domain is not None:
                domain.Free()
            intra = ctx.comm.Split(self.node, ctx.rank)
        self.intra = CommContext(intra, CommStats())
        self.inter = CommContext(ctx.comm.Split(self.local_rank, self.node), CommStats())

    def describe(self):
        extra = f", flattened from node sizes {self.node_sizes}" if self.flat_fallback else ""
        return f"{self.nodes} node(s) x {self.local_size} rank(s){extra}"

    # -- the three stages -----------------------------------------------------------------------
    def allreduce(self, x, encode, combine, out_dtype=None, intra_wire=None,
                  message_nbytes=None, merge=None):
        """The sum over all ranks of ``x`` (see the module docstring); a new array.
        ``intra_wire``: None (the intra reduce-scatter sends ``x``'s own dtype), or
        ``(pack, node_sum)`` for values that fit a narrower wire format (e.g. ±1 votes, 1 bit
        each): ``pack(slice) -> uint8`` (its length a function of the slice's length alone)
        encodes what a local rank sends, ``node_sum(rows, count)`` sums the ``(local_size,
        nbytes)`` uint8 rows (local-rank order) of a shard of ``count`` elements into the
        node's sum, as the default path would compute it.
        ``message_nbytes``: None, or the inter-node message's byte length for a shard of k
        elements (``k -> int``); then, with several nodes, the intra gather sends each shard's
        nodes' messages (``N * B(shard)`` bytes) instead of its result (``shard * c``), and
        every rank combines every shard itself (the same deterministic ``combine``, so the
        same result): less traffic when ``R * B(k) < k * c`` (R = ``message_rows(merge)``),
        e.g. 1-bit messages from fewer than 8 c nodes, or merged ones.
        ``merge``: None, or the inter ring's per-hop combine (module docstring, stage 2)."""
        x = np.ascontiguousarray(x).reshape(-1)
        out_dtype = np.dtype(out_dtype if out_dtype is not None else x.dtype)
        bounds = shard_bounds(x.size, self.local_size, self.align)
        r = self.local_rank
        shard = Shard(bounds[r], bounds[r + 1], r, self.node, self.local_size, self.nodes)
        node_sum = (self.reduce_scatter(x, bounds) if intra_wire is None or self.local_size == 1
                    else self.reduce_scatter_packed(x, bounds, *intra_wire))
        if self.nodes == 1:
            part = node_sum
        else:
            message = np.ascontiguousarray(encode(node_sum, shard), dtype=np.uint8).reshape(-1)
            messages = (self.merge_ring(message, merge) if self.message_rows(merge) == 1
                        else self.exchange(message))
            if message_nbytes is not None:
                return self.allgather_messages(messages, bounds, combine, out_dtype,
                                               message_nbytes)
            part = combine(messages, shard)
        return self.allgather(part, bounds, out_dtype)

    def reduce_scatter(self, x, bounds):
        """This rank's shard of the node's sum of ``x`` (summed in local-rank order)."""
        L, r = self.local_size, self.local_rank
        rows = np.empty((L, bounds[r + 1] - bounds[r]), dtype=x.dtype)
        rows[r] = x[bounds[r]:bounds[r + 1]]
        with _Leg(self, self.intra) as leg:
            for t in range(1, L):
                dst, src = (r + t) % L, (r - t) % L
                leg.add(*_exchange(self.intra.comm, x[bounds[dst]:bounds[dst + 1]], rows[src],
                                   dst, src))
        return rows.sum(axis=0, dtype=x.dtype) if L > 1 else rows[0]

    def reduce_scatter_packed(self, x, bounds, pack, node_sum):
        """``reduce_scatter`` with every local rank's part sent as ``pack(part)`` (uint8) and the
        node's sum formed by ``node_sum(rows, count)`` (``allreduce``'s ``intra_wire``)."""
        L, r = self.local_size, self.local_rank
        mine = pack(x[bounds[r]:bounds[r + 1]])
        rows = np.empty((L, mine.size), dtype=np.uint8)
        rows[r] = mine
        with _Leg(self, self.intra) as leg:
            for t in range(1, L):
                dst, src = (r + t) % L, (r - t) % L
                leg.add(*_exchange(self.intra.comm, pack(x[bounds[dst]:bounds[dst + 1]]),
                                   rows[src], dst, src))
        return node_sum(rows, bounds[r + 1] - bounds[r])

    def exchange(self, message):
        """All-gather ``message`` (uint8, the same length on every node) between the nodes:
        a (nodes, nbytes) array in node order."""
        N, k = self.nodes, self.node
        rows = np.empty((N, message.size), dtype=np.uint8)
        rows[k] = message
        with _Leg(self, self.inter) as leg:
            for t in range(1, N):
                dst, src = (k + t) % N, (k - t) % N
                leg.add(*_exchange(self.inter.comm, message, rows[src], dst, src))
        return rows

    def message_rows(self, merge):
        """How many rows of messages ``combine`` gets with ``merge`` (None or a per-hop combine):
        1 when the nodes' messages are merged along a ring (``merge`` given, 3 nodes or more),
        else one per node."""
        return 1 if merge is not None and merges(self.nodes) else self.nodes

    def merge_ring(self, message, merge):
        """The nodes' ``message``s merged along the ring of ``inter`` ranks by ``merge`` (ring
        reduce-scatter, then all-gather of the merged chunks): a (1, nbytes) array, identical
        on every node; its bytes and time counted in the inter leg and the parent."""
        buf = np.array(message, dtype=np.uint8, copy=True)
        before = self.inter.stats.snapshot()
        ring_allreduce(self.inter, buf, merge)
        spent = self.inter.stats.since(before)
        self.parent.stats.add(spent.bytes_sent, spent.bytes_recv, spent.messages, spent.rounds)
        self.parent.stats.seconds += spent.seconds
        return buf[None, :]

    def allgather(self, part, bounds, dtype):
        """Every local rank's shard result, concatenated: the full length ``bounds[-1]``."""
        L, r = self.local_size, self.local_rank
        out = np.empty(bounds[-1], dtype=dtype)
        out[bounds[r]:bounds[r + 1]] = part
        mine = out[bounds[r]:bounds[r + 1]]
        with _Leg(self, self.intra) as leg:
            for t in range(1, L):
                dst, src = (r + t) % L, (r - t) % L
                leg.add(*_exchange(self.intra.comm, mine, out[bounds[src]:bounds[src + 1]],
                                   dst, src))
        return out

    def allgather_messages(self, messages, bounds, combine, dtype, message_nbytes):
        """Every local rank's shard's ``(rows, nbytes)`` messages gathered inside the node, and
        every shard combined here: the full length ``bounds[-1]`` in ``dtype``."""
        L, r = self.local_size, self.local_rank
        rows = [np.empty((len(messages), message_nbytes(bounds[s + 1] - bounds[s])), np.uint8)
                for s in range(L)]
        rows[r] = np.ascontiguousarray(messages)
        with _Leg(self, self.intra) as leg:
            for t in range(1, L):
                dst, src = (r + t) % L, (r - t) % L
                leg.add(*_exchange(self.intra.comm, rows[r], rows[src], dst, src))
        out = np.empty(bounds[-1], dtype=dtype)
        for s in range(L):
            shard = Shard(bounds[s], bounds[s + 1], s, self.node, L, self.nodes)
            out[bounds[s]:bounds[s + 1]] = combine(rows[s], shard)
        return out

    def leg_stats(self):
        """Snapshots of the byte counters of both legs: {'intra': CommStats, 'inter': ...}."""
        return {"intra": self.intra.stats.snapshot(), "inter": self.inter.stats.snapshot()}


class _Leg:
    """Counts one stage's bytes, messages, rounds (one per exchange) and time in its leg's and
    the parent's stats."""

    def __init__(self, hierarchy, leg_ctx):
        self.targets = (leg_ctx.stats, hierarchy.parent.stats)
        self.counts = [0, 0, 0, 0]

    def add(self, sent, recv, messages):
        self.counts = [self.counts[0] + sent, self.counts[1] + recv, self.counts[2] + messages,
                       self.counts[3] + 1]

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        seconds = time.perf_counter() - self.t0
        for stats in self.targets:
            stats.add(*self.counts)
            stats.seconds += seconds


class NodeMemory:
    """One shared-memory window per node (``MPI.Win.Allocate_shared`` over ``intra``) for the
    exact intra-node stages of ``hvdcomp.hierarchical``: each rank writes its whole vector once
    and reads the others' where they lie, instead of sending float32 shards through MPI's
    shared-memory transport (copied in and out of its buffers): 4 ranks on 2 cores spent ~180 ms
    per ResNet-18 step that way. ``usable``: False where the node's ranks do not share memory
    (e.g. ``HVDCOMP_RANKS_PER_NODE`` grouping ranks of different machines); then
    ``hvdcomp.hierarchical`` runs the method flat. Collective over ``intra`` where noted."""

    def __init__(self, intra, shares_memory=None):
        from mpi4py import MPI
        self.intra, self.cap, self.win, self.views = intra, 0, None, None
        if shares_memory:  # ``intra`` is a shared-memory domain (``Hierarchy.shares_memory``)
            self.usable = True
            return
        shared = intra.comm.Split_type(MPI.COMM_TYPE_SHARED, key=intra.rank)
        self.usable = bool(intra.comm.allreduce(int(shared.Get_size() == intra.size), op=MPI.MIN))
        shared.Free()

    def reserve(self, n):
        """Room for vectors of ``n`` float32 per rank, plus the node's result (collective; the
        same ``n`` on every rank of the node). Grows only."""
        if n <= self.cap:
            return
        from mpi4py import MPI
        if self.win is not None:
            free_now(self.win)
        cap = max(int(n), 2 * self.cap)
        # every rank's part: its input vector, then (local rank 0's only used) the result
        self.win = free_at_exit(MPI.Win.Allocate_shared(2 * cap * 4, 4, comm=self.intra.comm))
        self.views = []
        for r in range(self.intra.size):
            buf, _ = self.win.Shared_query(r)
            self.views.append(np.frombuffer(buf, dtype=np.float32, count=2 * cap))
        self.cap = cap

    def inputs(self):
        """Every local rank's input vector (views of length ``cap``), in local-rank order."""
        return [v[:self.cap] for v in self.views]

    def result(self):
        """The node's result vector (local rank 0's second half; every rank writes its part)."""
        return self.views[0][self.cap:]

    def barrier(self):
        self.intra.comm.Barrier()
