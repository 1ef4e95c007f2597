"""The transport hvdcomp's collectives run on, and its torch.distributed implementation.

A ``CommContext`` (``hvdcomp.comm.context``) holds a transport as ``ctx.comm``. The ring, the
tree, the votes, the sparse transfers and the node stages use only this subset of mpi4py's
``Intracomm`` (buffers are contiguous NumPy arrays; counts and dtypes agree on every rank):

- ``Get_rank()``, ``Get_size()``;
- point to point: ``Send(buf, dest, tag)``, ``Recv(buf, source, tag)``, ``Isend``/``Irecv``
  (same arguments) returning requests whose class has ``Waitall(requests)``;
- collectives: ``Allgather(send, recv)`` (recv shaped ``(size, len)``), ``Iallgather`` (a
  request), ``Allgatherv(send, [recv, counts])``, ``Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``,
  ``Barrier()``; of picklable objects: ``allgather(obj)``, ``bcast(obj, root)``,
  ``allreduce(obj, op=MPI.MIN)``;
- groups: ``Split(color, key)`` (collective over the transport's ranks), ``Split_type(
  MPI.COMM_TYPE_SHARED, key)`` (the ranks that share memory with this one) and ``Free()``.

mpi4py's communicator is one implementation (``hvdcomp.comm.context.get_context``, for
Horovod). ``TorchTransport`` is the other: the same calls on a torch.distributed process group
(Gloo on CPU tensors; the NumPy buffers are shared with the tensors, not copied), so that a
``torchrun`` launch runs every method with no MPI rank (``hvdcomp.ddp``). ``torch_context(group)``
makes its ``CommContext``. Nodes come from torchrun's ``GROUP_RANK`` (the host's index) where
it is set, else the host name (``node_of_ranks``); the intra-node shared-memory window of
``hvdcomp.comm.hierarchy.NodeMemory`` is MPI's only, so under this transport the node stages of
``hvdcomp.hierarchical`` run the method flat, while BinSGDM's own stages (point to point) run.
"""
import os
import socket

import numpy as np
from mpi4py import MPI


class _Done:
    """A request already complete (the transport's blocking calls return one)."""

    def Wait(self):
        return None

    @staticmethod
    def Waitall(requests):
        for r in requests:
            r.Wait()


class _Pending(_Done):
    """A torch.distributed request (``torch.distributed.Work``) in flight."""

    def __init__(self, work, keep):
        self.work, self.keep = work, keep  # the tensors live until the request completes

    def Wait(self):
        if self.work is not None:
            self.work.wait()
            self.work = self.keep = None


class TorchTransport:
    """The transport interface (module docstring) over a torch.distributed ``group`` (None: the
    default group). Point-to-point messages are Gloo's own tagged sends; collectives are
    ``all_gather``/``all_reduce`` on tensors that share the NumPy buffers' memory."""

    def __init__(self, group=None):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.global_ranks = [self._global(r) for r in range(self.size)]

    def _global(self, r):
        return r if self.group is None else self.dist.get_global_rank(self.group, r)

    @staticmethod
    def _tensor(buf):
        import torch
        return torch.from_numpy(np.ascontiguousarray(buf).view(np.uint8).reshape(-1))

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    # -- point to point ------------------------------------------------------------------------
    def Isend(self, buf, dest, tag=0):
        t = self._tensor(buf)
        return _Pending(self.dist.isend(t, self.global_ranks[dest], self.group, tag), t)

    def Irecv(self, buf, source, tag=0):
        t = self._tensor(buf)
        return _Pending(self.dist.irecv(t, self.global_ranks[source], self.group, tag), t)

    def Send(self, buf, dest, tag=0):
        self.Isend(buf, dest, tag).Wait()

    def Recv(self, buf, source, tag=0):
        self.Irecv(buf, source, tag).Wait()

    # -- collectives ---------------------------------------------------------------------------
    def Allgather(self, send, recv):
        if recv.size == 0:
            return
        rows = recv.reshape(self.size, -1)
        self.dist.all_gather([self._tensor(row) for row in rows], self._tensor(send),
                             group=self.group)

    def Iallgather(self, send, recv):
        self.Allgather(send, recv)
        return _Done()

    def Allgatherv(self, send, recv_counts):
        recv, counts = recv_counts
        longest = max(counts) if counts else 0
        padded = np.zeros(longest, dtype=send.dtype)
        padded[:send.size] = send
        rows = np.empty((self.size, longest), dtype=send.dtype)
        self.Allgather(padded, rows)
        off = 0
        for r, n in enumerate(counts):
            recv[off:off + n] = rows[r, :n]
            off += n

    def Allreduce(self, send, buf, op=MPI.SUM):
        if send is not MPI.IN_PLACE or op != MPI.SUM:
            raise NotImplementedError("TorchTransport.Allreduce sums in place only")
        import torch
        self.dist.all_reduce(torch.from_numpy(buf), group=self.group)

    def Barrier(self):
        self.dist.barrier(group=self.group)

    def allgather(self, obj):
        rows = [None] * self.size
        self.dist.all_gather_object(rows, obj, group=self.group)
        return rows

    def bcast(self, obj, root=0):
        box = [obj]
        self.dist.broadcast_object_list(box, src=self.global_ranks[root], group=self.group)
        return box[0]

    def allreduce(self, obj, op=MPI.SUM):
        rows = self.allgather(obj)
        for known, reduce in ((MPI.SUM, sum), (MPI.MIN, min), (MPI.MAX, max)):
            if op == known:
                return reduce(rows)
        raise NotImplementedError("TorchTransport.allreduce: SUM, MIN or MAX")

    # -- groups --------------------------------------------------------------------------------
    def Split(self, color, key):
        """The ranks with the same ``color`` as a new transport, ordered by ``key`` (which must
        order them as their ranks do: torch.distributed orders a group's ranks by rank). Every
        rank of this transport's group creates every subgroup, in the same order."""
        pairs = self.allgather((int(color), int(key), self.rank))
        mine = None
        for c in sorted({p[0] for p in pairs}):
            members = sorted((k, r) for cc, k, r in pairs if cc == c)
            ranks = [r for _, r in members]
            if ranks != sorted(ranks):
                raise NotImplementedError("TorchTransport.Split: keys must follow rank order")
            group = self.dist.new_group([self.global_ranks[r] for r in ranks])
            if c == color:
                mine = group
        return TorchTransport(mine)

    def Split_type(self, split_type, key=0):
        """The ranks that share memory with this one: this rank alone (the node stages' window
        is MPI's; see the module docstring)."""
        return _Solo()

    def node_of_ranks(self):
        """The node index of every rank (identical on every rank; nodes numbered by their lowest
        rank): torchrun's ``GROUP_RANK`` where set, else the host name."""
        here = os.environ.get("GROUP_RANK") or socket.gethostname()
        hosts = self.allgather(here)
        order = []
        for h in hosts:
            if h not in order:
                order.append(h)
        return [order.index(h) for h in hosts]

    def Free(self):
        return None


class _Solo:
    """A transport of one rank (what ``TorchTransport.Split_type`` finds)."""

    def Get_size(self):
        return 1

    def Free(self):
        return None


def torch_context(group=None):
    """The ``CommContext`` of torch.distributed process ``group`` (None: the default group)."""
    from hvdcomp.comm.context import CommContext
    return CommContext(TorchTransport(group))

