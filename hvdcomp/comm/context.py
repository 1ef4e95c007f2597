"""The communicator hvdcomp uses, duplicated from MPI.COMM_WORLD so that its messages never mix
with Horovod's (which shares the same MPI library and runs in a background thread).

``get_context()`` returns one process-wide context. It checks that MPI gives
``MPI_THREAD_MULTIPLE`` (hvdcomp's calls run in the training thread while Horovod's background
thread also calls MPI) and that the launch started real MPI ranks.

Importing this module imports ``mpi4py.MPI``, which initialises MPI (THREAD_MULTIPLE) unless it
is already up. Importing hvdcomp before ``hvd.init()`` (the usual order) therefore leaves MPI's
lifetime to mpi4py, which finalises it at process exit, after Horovod's shutdown. Otherwise
Horovod owns MPI, and its background thread finalises MPI as soon as the first rank of the job
shuts down, cutting off a slower rank's last collectives (seen in tests at the end of a job).

An exception that ends one rank (uncaught in the main thread) aborts the whole MPI job
(``MPI_Abort``, exit code 1) after its traceback and a line naming the rank are printed, as
``python -m mpi4py`` does: otherwise that rank would wait forever in ``MPI_Finalize`` for ranks that wait in a collective
for it (seen: a Horovod stall shutdown on one rank hung the job). Installed at import when MPI
has more than one rank; ``HVDCOMP_ABORT_ON_EXCEPTION=0`` leaves ``sys.excepthook`` alone.
"""
import atexit
import os
import sys
import threading

import numpy as np
from mpi4py import MPI

from hvdcomp.comm.stats import CommStats
from hvdcomp.errors import LaunchError

# The largest single MPI message, in bytes. Larger transfers are split into several messages, so
# counts stay below 2**31 whatever the buffer size. Tests lower it to exercise the splitting.
MAX_MESSAGE_BYTES = 1 << 30

_lock = threading.Lock()
_context = None
_subsets = {}  # sorted tuple of world ranks -> CommContext of that process set
_communicators = []  # every communicator (and shared window) hvdcomp created, freed at exit
# (see _free_all; reversed, so a window goes before the communicator it was made on)


class CommContext:
    """A duplicated communicator plus byte counters.

    ``comm`` is an ``mpi4py.MPI.Intracomm``; ``rank``/``size`` are its rank and size;
    ``stats`` counts the bytes this rank sends and receives through any hvdcomp collective.
    """

    def __init__(self, comm, stats=None):
        self.comm = free_at_exit(comm)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.stats = stats if stats is not None else CommStats()

    def allgather_array(self, local, dtype=np.float64):
        """Gather a 1-D array of the same length and ``dtype`` (float64 by default, e.g. uint8
        for packed bits) from every rank: shape (size, len)."""
        local, out = self._gather_buffers(local, dtype)
        self.comm.Allgather(local, out)
        return out

    def iallgather_array(self, local, dtype=np.float64):
        """``allgather_array`` started without waiting for it: a ``Gathered`` whose ``wait()``
        returns the (size, len) array. Every rank starts it at the same point of its
        collectives on this communicator; MPI progresses it inside the calls that follow (on
        any communicator), so its round trip overlaps theirs."""
        local, out = self._gather_buffers(local, dtype)
        request = self.comm.Iallgather(local, out)

        def complete(buffers=(local, out)):  # the buffers live until the gather is done
            request.Wait()
            return buffers[1]
        return Gathered(complete)

    def _gather_buffers(self, local, dtype):
        """The buffers of an all-gather of ``local``: it as a contiguous 1-D ``dtype`` array,
        and the ``(size, len)`` array to fill; the bytes it moves are counted."""
        local = np.ascontiguousarray(local, dtype=dtype).reshape(-1)
        moved = local.nbytes * max(self.size - 1, 0)
        self.stats.add(moved, moved)
        return local, np.empty((self.size, local.size), dtype=dtype)

    def allgather_object(self, obj):
        """Gather a picklable object from every rank (for error reports, not for hot paths)."""
        return self.comm.allgather(obj)

    def bcast_object(self, obj, root=0):
        """``obj`` from rank ``root`` on every rank (picklable; for rare control messages)."""
        return self.comm.bcast(obj, root=root)

    def split(self, color, key):
        """A sub-context over the ranks with the same ``color``, ordered by ``key``; it shares
        this context's byte counters."""
        return CommContext(self.comm.Split(color, key), self.stats)


class Gathered:
    """Every rank's rows of an all-gather (``CommContext.iallgather_array``), or a value made
    from them, available once the gather completes: ``wait()`` completes it (the first call;
    then it returns the same array), and indexing or ``np.asarray`` waits. ``then(f)``: the
    value ``f`` makes of it, completed with it. ``Gathered.of(array)``: one already complete."""

    def __init__(self, complete):
        self._complete, self._value = complete, None

    @classmethod
    def of(cls, array):
        return cls(lambda: array)

    def wait(self):
        if self._complete is not None:
            self._value, self._complete = self._complete(), None
        return self._value

    def then(self, f):
        return Gathered(lambda: f(self.wait()))

    def __getitem__(self, index):
        return self.wait()[index]

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.wait(), dtype=dtype)


def free_at_exit(obj):
    """Have ``obj`` (a communicator or window hvdcomp made) freed at exit with the others
    (``_free_all``); returns it."""
    _communicators.append(obj)
    return obj


def free_now(obj):
    """Free ``obj`` (given to ``free_at_exit``) now."""
    _communicators.remove(obj)
    obj.Free()


def _free_all():
    """Free hvdcomp's communicators (and windows) while MPI is still up. Registered at the first
    ``get_context()``, i.e. after Horovod's and mpi4py's own exit handlers, so (exit handlers
    run last-registered first) it runs before either finalises MPI; otherwise the communicator
    objects would be released after MPI_Finalize, which Open MPI aborts on."""
    global _context
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for comm in reversed(_communicators):
            try:
                comm.Free()
            except Exception:  # noqa: BLE001 - already freed, or MPI going down
                pass
    _communicators.clear()
    _subsets.clear()
    _context = None


def world_rank():
    """This process's rank in MPI's world (no communication)."""
    return MPI.COMM_WORLD.Get_rank()


def world_size():
    return MPI.COMM_WORLD.Get_size()


def get_context(ranks=None):
    """The process-wide hvdcomp context over all MPI ranks, or with ``ranks`` (a sorted tuple
    of world ranks including this one: a Horovod process set) over those ranks only. Created on
    first use: the world's by every rank together, a set's by the set's ranks together."""
    world = _world_context()
    if ranks is None or len(ranks) == world.size:
        return world
    with _lock:
        sub = _subsets.get(ranks)
        if sub is None:
            if world.rank not in ranks:
                raise ValueError(f"rank {world.rank} is not in the process set {list(ranks)}")
            group = world.comm.Get_group().Incl(list(ranks))
            tag = 1000 + hash(ranks) % 30000
            sub = _subsets[ranks] = CommContext(world.comm.Create_group(group, tag), world.stats)
            group.Free()
        return sub


def existing_context():
    """The world context if this process has created it (hvdcomp has communicated), else None;
    creates nothing (creating it is a collective)."""
    return _context


def _world_context():
    global _context
    with _lock:
        if _context is None:
            level = MPI.Query_thread()
            if level < MPI.THREAD_MULTIPLE:
                raise LaunchError(
                    "hvdcomp needs MPI_THREAD_MULTIPLE (Horovod's background thread and hvdcomp "
                    f"both call MPI), but MPI was initialised with thread level {level}. Do not set "
                    "HOROVOD_MPI_THREADS_DISABLE, and use an MPI built with thread support.")
            _context = CommContext(MPI.COMM_WORLD.Dup())
            atexit.register(_free_all)
        return _context


def _install_abort_on_uncaught_exception():
    """Chain ``sys.excepthook`` so that an uncaught exception aborts every rank (see above)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        try:
            world = MPI.COMM_WORLD
            sys.stderr.write(
                f"hvdcomp: uncaught {exc_type.__name__} on rank {world.Get_rank()} of "
                f"{world.Get_size()}; aborting the MPI job (HVDCOMP_ABORT_ON_EXCEPTION=0 "
                "turns this off)\n")
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if MPI.Is_initialized() and not MPI.Is_finalized():
                MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook


if MPI.COMM_WORLD.Get_size() > 1 and os.environ.get("HVDCOMP_ABORT_ON_EXCEPTION", "1") != "0":
    _install_abort_on_uncaught_exception()
