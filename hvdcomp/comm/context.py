"""The communicator hvdcomp uses, duplicated from MPI.COMM_WORLD so that its messages never mix
with Horovod's (which shares the same MPI library and runs in a background thread).

``get_context()`` returns one process-wide context. It checks that MPI gives
``MPI_THREAD_MULTIPLE`` (hvdcomp's calls run in the training thread while Horovod's background
thread also calls MPI) and that the launch started real MPI ranks.
"""
import threading

import numpy as np

from hvdcomp.comm.stats import CommStats
from hvdcomp.errors import LaunchError

# The largest single MPI message, in bytes. Larger transfers are split into several messages, so
# counts stay below 2**31 whatever the buffer size. Tests lower it to exercise the splitting.
MAX_MESSAGE_BYTES = 1 << 30

_lock = threading.Lock()
_context = None


def _mpi():
    from mpi4py import MPI
    return MPI


class CommContext:
    """A duplicated communicator plus byte counters.

    ``comm`` is an ``mpi4py.MPI.Intracomm``; ``rank``/``size`` are its rank and size;
    ``stats`` counts the bytes this rank sends and receives through any hvdcomp collective.
    """

    def __init__(self, comm, stats=None):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.stats = stats if stats is not None else CommStats()

    def allgather_array(self, local):
        """Gather a 1-D float64 array of the same length from every rank: shape (size, len)."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1)
        out = np.empty((self.size, local.size), dtype=np.float64)
        self.comm.Allgather(local, out)
        self.stats.add(local.nbytes * max(self.size - 1, 0), local.nbytes * max(self.size - 1, 0))
        return out

    def allgather_object(self, obj):
        """Gather a picklable object from every rank (for error reports, not for hot paths)."""
        return self.comm.allgather(obj)

    def split(self, color, key):
        """A sub-context over the ranks with the same ``color``, ordered by ``key``; it shares
        this context's byte counters."""
        return CommContext(self.comm.Split(color, key), self.stats)


def get_context():
    """The process-wide hvdcomp context over all MPI ranks (created on first use)."""
    global _context
    with _lock:
        if _context is None:
            MPI = _mpi()
            if not MPI.Is_initialized():
                MPI.Init_thread(MPI.THREAD_MULTIPLE)
            level = MPI.Query_thread()
            if level < MPI.THREAD_MULTIPLE:
                raise LaunchError(
                    "hvdcomp needs MPI_THREAD_MULTIPLE (Horovod's background thread and hvdcomp "
                    f"both call MPI), but MPI was initialised with thread level {level}. Do not set "
                    "HOROVOD_MPI_THREADS_DISABLE, and use an MPI built with thread support.")
            _context = CommContext(MPI.COMM_WORLD.Dup())
        return _context
