"""An in-process transport of N simulated ranks (one thread each), for unit tests of a method's
math: ``run(make_method, grads, steps)`` drives a method's ``prepare`` and ``reduce`` on every
simulated rank through the method contract (``hvdcomp.methods.contract``) and hvdcomp's own
collectives (ring, tree, votes, all-gathers), as the step engine does, without MPI, Horovod or
the engine. For unit tests only: the real-rank tests run the same methods on MPI and Gloo.

``InProcessTransport`` implements the transport interface of ``hvdcomp.comm.transport`` (the
subset of mpi4py's communicator hvdcomp uses): point-to-point messages through per-(source,
destination, tag) queues, collectives through a shared slot per rank between two barriers,
reductions summed in rank order (the same bits on every rank), ``Split`` into subgroups;
``node_of_ranks`` puts ``ranks_per_node`` consecutive ranks on a node.
"""
import queue
import threading
from collections import defaultdict

import numpy as np

from hvdcomp import preconditioning
from hvdcomp.comm.context import CommContext, Gathered
from hvdcomp.methods.contract import Batch, Entry
from hvdcomp.state import StateStore

TIMEOUT = 60  # seconds any rank waits for another before the test fails (never a hang)


class _Group:
    """What the ranks of one (sub)group share: its size, a barrier, one slot per rank for the
    collectives, the point-to-point queues and the subgroups ``Split`` made."""

    def __init__(self, size, ranks_per_node):
        self.size, self.ranks_per_node = size, ranks_per_node
        self.barrier = threading.Barrier(size, timeout=TIMEOUT)
        self.slots = [None] * size
        self.lock = threading.Lock()
        self.queues = defaultdict(queue.Queue)  # (source, dest, tag) -> messages
        self.splits = {}  # (split number, color) -> _Group


class _Request:
    """A request: ``Wait`` completes it (a receive copies its message into its buffer)."""

    def __init__(self, complete=None):
        self.complete = complete

    def Wait(self):
        if self.complete is not None:
            self.complete()
            self.complete = None

    @staticmethod
    def Waitall(requests):
        for r in requests:
            r.Wait()


class InProcessTransport:
    """Rank ``rank`` of ``group`` (a ``_Group``; module docstring)."""

    def __init__(self, group, rank):
        self.group, self.rank, self.size = group, rank, group.size
        self.splits = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    # -- point to point ------------------------------------------------------------------------
    def Isend(self, buf, dest, tag=0):
        self.group.queues[(self.rank, dest, tag)].put(np.array(buf, copy=True))
        return _Request()

    def Irecv(self, buf, source, tag=0):
        def complete():
            message = self.group.queues[(source, self.rank, tag)].get(timeout=TIMEOUT)
            np.copyto(buf, message.reshape(buf.shape))
        return _Request(complete)

    def Send(self, buf, dest, tag=0):
        self.Isend(buf, dest, tag).Wait()

    def Recv(self, buf, source, tag=0):
        self.Irecv(buf, source, tag).Wait()

    # -- collectives ---------------------------------------------------------------------------
    def _everyone(self, value):
        """Every rank's ``value``, in rank order (a collective)."""
        self.group.slots[self.rank] = value
        self.group.barrier.wait()
        values = list(self.group.slots)
        self.group.barrier.wait()
        return values

    def Allgather(self, send, recv):
        rows = self._everyone(np.array(send, copy=True).reshape(-1))
        recv.reshape(self.size, -1)[...] = np.stack(rows)

    def Iallgather(self, send, recv):
        self.Allgather(send, recv)
        return _Request()

    def Allgatherv(self, send, recv_counts):
        recv, counts = recv_counts
        rows = self._everyone(np.array(send, copy=True).reshape(-1))
        recv[:sum(counts)] = np.concatenate(rows)

    def Allreduce(self, send, buf, op=None):
        rows = self._everyone(np.array(buf, copy=True))
        total = rows[0].copy()
        for row in rows[1:]:
            total += row
        buf[...] = total

    def Barrier(self):
        self._everyone(None)

    def allgather(self, obj):
        return self._everyone(obj)

    def bcast(self, obj, root=0):
        return self._everyone(obj)[root]

    def allreduce(self, obj, op=None):
        rows = self._everyone(obj)
        name = getattr(op, "name", None) or str(op)
        return min(rows) if "MIN" in name.upper() else max(rows) if "MAX" in name.upper() \
            else sum(rows)

    # -- groups --------------------------------------------------------------------------------
    def Split(self, color, key):
        self.splits += 1
        pairs = self.allgather((color, key, self.rank))
        members = sorted((k, r) for c, k, r in pairs if c == color)
        with self.group.lock:
            sub = self.group.splits.setdefault(
                (self.splits, color), _Group(len(members), self.group.ranks_per_node))
        return InProcessTransport(sub, [r for _, r in members].index(self.rank))

    def node_of_ranks(self):
        return [r // self.group.ranks_per_node for r in range(self.size)]

    def Free(self):
        return None


def contexts(size, ranks_per_node=None):
    """``CommContext``s of ``size`` simulated ranks (one node of them by default)."""
    group = _Group(size, ranks_per_node or size)
    return [CommContext(InProcessTransport(group, r)) for r in range(size)]


def run(make_method, grads, steps=1, ranks_per_node=None, seed=1, gradient=True):
    """Run ``steps`` steps of the method ``make_method()`` makes on ``len(grads)`` simulated
    ranks, rank r reducing the tensors ``grads[r]`` (``{name: float32 array}``, the same names
    and shapes on every rank; a callable ``grads(step)`` gives each step's). Returns
    ``(steps_out, contexts)``: ``steps_out[t][r]`` is ``{name: flat step}`` of rank r at step t,
    ``contexts[r]`` rank r's ``CommContext`` (``stats``: the bytes it sent). ``gradient``: the
    tensors are an optimizer's gradients (False: a direct all-reduce's, ``Entry.gradient``)."""
    size = len(grads(0) if callable(grads) else grads)
    ctxs = contexts(size, ranks_per_node)
    out = [[None] * size for _ in range(steps)]
    errors = []

    def rank(r):
        try:
            method, store = make_method(), StateStore()
            method.seed = seed
            method.preconditioner = preconditioning.make(None, method.under_adam)
            for t in range(steps):
                mine = (grads(t) if callable(grads) else grads)[r]
                entries = [Entry(k, np.array(g, dtype=np.float32).reshape(-1), np.shape(g),
                                 gradient=gradient) for k, g in sorted(mine.items())]
                batch = Batch(entries, ctxs[r], store, step=t)
                local = np.asarray(method.prepare(batch), dtype=np.float64)
                every = ctxs[r].allgather_array(local.reshape(-1)).reshape(
                    size, len(entries), method.n_scalars)
                reduced = method.reduce(batch, Gathered.of(every))
                out[t][r] = {e.key: np.array(np.asarray(s), copy=True).reshape(-1)
                             for e, s in zip(entries, reduced)}
                store.commit()
        except BaseException as exc:  # noqa: BLE001: reported by the test's thread
            errors.append((r, exc))
            for ctx in ctxs:
                ctx.comm.group.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    if errors:
        raise errors[0][1]
    assert not any(t.is_alive() for t in threads), "a simulated rank hung"
    return out, ctxs
