"""Which tensor ``compress()`` was handed: an explicit ``Identity``
(``hvdcomp.facade.frontends``) read from a table of the Horovod functions that call compressors,
or ``UnnamedTensorError``.

Horovod's ``Compressor`` protocol passes ``compress()`` the tensor alone, but hvdcomp keeps
per-tensor state (error feedback, momentum, preconditioner moments) under the tensor's name, which
must be the same on every rank and distinct per tensor. Each framework adapter therefore lists,
in one table (``callers()`` in ``hvdcomp.facade.frontends.torch`` and
``hvdcomp.facade.frontends.tensorflow``), the Horovod functions it serves and which of their
locals hold the name, the parameter, the process set and the optimizer. The lookup walks up a bounded number of frames from
``compress()``, matches a frame to a row by the function itself (its code object; for
TensorFlow, the module and the function name, since AutoGraph re-compiles Horovod's functions as
``tf__<name>``), and then finds the tensor in that frame *by identity* (``is``): never by a
frame's position in the stack, never through a comprehension's own frame (Python 3.12 inlines
comprehensions, PEP 709), never by arrival order. A tensor that no row claims, or a direct call
without ``name=``, raises ``UnnamedTensorError`` on the rank that made it. NumPy arrays (direct
use) are named explicitly (``hvdcomp.facade.frontends.numpy.named``).
"""
import threading
from typing import Callable, NamedTuple

from hvdcomp.errors import UnnamedTensorError


class Caller(NamedTuple):
    """One row of an adapter's table: a Horovod function that calls ``compress()``."""
    function: str  # where it lives, e.g. 'horovod.torch.mpi_ops.allreduce'
    reads: str  # which of its locals the row reads (documentation)
    matches: Callable  # frame -> bool: is this frame a call of ``function``?
    read: Callable  # (frame, tensor) -> Identity, or None when ``tensor`` is not this call's


def locate(tensor, callers, frame, limit):
    """``(frame, Identity)`` of ``tensor`` from the nearest of ``limit`` frames, starting at
    ``frame`` and going up, that a row of ``callers`` matches and reads; None if none does."""
    for _ in range(limit):
        if frame is None:
            return None
        for row in callers:
            if row.matches(frame):
                identity = row.read(frame, tensor)
                if identity is not None:
                    return frame, identity
        frame = frame.f_back
    return None


def find(tensor, callers, frame, limit):
    """The ``Identity`` part of ``locate``, or None."""
    hit = locate(tensor, callers, frame, limit)
    return None if hit is None else hit[1]


def code_of(function):
    """A ``matches`` predicate: the frame runs exactly ``function``'s code."""
    code = function.__code__

    def matches(frame):
        return frame.f_code is code
    matches.code = code  # for adapters that index their rows by code
    return matches


_served_lock = threading.Lock()
# id(sequence) -> (sequence, positions handed out), for the last few sequences that held one
# tensor object at several positions (the sequence is kept so that its id is not reused).
_served = {}
_SERVED_KEPT = 16


def position(seq, tensor):
    """The index of ``tensor`` in ``seq`` by identity, or None. When the same object sits at
    several positions (TensorFlow hands one gradient tensor to two variables that are simply
    added), successive lookups in the same sequence hand out those positions in order."""
    hits = [i for i, item in enumerate(seq) if item is tensor]
    if len(hits) <= 1:
        return hits[0] if hits else None
    with _served_lock:
        kept = _served.pop(id(seq), None)
        served = kept[1] if kept is not None and kept[0] is seq else set()
        free = [i for i in hits if i not in served] or hits  # all served: a new reduction
        if free is hits:
            served.difference_update(hits)
        served.add(free[0])
        _served[id(seq)] = (seq, served)  # most recent last
        while len(_served) > _SERVED_KEPT:
            del _served[next(iter(_served))]
        return free[0]


def group_member(name, index, count):
    """Horovod's own name of member ``index`` of a grouped call named ``name``."""
    return f"{name}_{index + 1}of{count}"


def _where():
    """'rank r of n' (Horovod's, else MPI's), or '' outside a job."""
    try:
        from hvdcomp.checks import horovod_world
        world = horovod_world()
        if world is not None:
            return f" on rank {world[1]} of {world[0]}"
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return f" on rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}"
    except Exception:  # noqa: BLE001 - the message must not fail
        pass
    return ""


def unnamed(method, shape, dtype, advice=None):
    """The ``UnnamedTensorError`` for a tensor of ``shape``/``dtype`` that compressor ``method``
    got from no caller it can name."""
    advice = advice or (
        "It came neither from a Horovod DistributedOptimizer / DistributedGradientTape (which "
        "name gradients after their parameters) nor from hvd.allreduce / hvd.grouped_allreduce "
        "with name=. Pass name= to hvd.allreduce (e.g. hvd.allreduce(x, name='x', "
        "compression=...))")
    return UnnamedTensorError(
        f"{method}: cannot name a tensor of shape {list(shape)} and dtype {dtype}{_where()}. "
        "hvdcomp keeps per-tensor state (error feedback) under each tensor's name. "
        f"{advice}: the same name on every rank, a different one for each tensor.")
