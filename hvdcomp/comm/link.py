"""How fast the ranks' network sums a buffer: a two-point measurement of an all-reduce.

``measure(comm, nbytes)`` times the transport's in-place sum of float32 buffers of two sizes (the
larger one ``nbytes`` clipped to [64 KiB, 4 MiB], the smaller an eighth of it; the fastest of
two calls each, after one untimed call) and fits ``latency + seconds_per_byte * bytes``. Every
rank takes rank 0's fit, so that decisions drawn from it are the same on every rank.

It is the cost of the collective a passed gradient goes through (Horovod's allreduce, DDP's
all-reduce: the same link, a ring algorithm alike), so ``Link.seconds(bytes)`` is a floor under
the exchange of a step that passes that many bytes: whatever overlaps it, those bytes cross the
link within the step. It takes five all-reduces: a few seconds at 20 Mbit/s, 0.1 s at 1 Gbit/s.
"""
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

SMALLEST, LARGEST = 64 << 10, 4 << 20  # the larger buffer's bounds, bytes


@dataclass(frozen=True)
class Link:
    """An all-reduce of ``b`` bytes takes ``latency + seconds_per_byte * b`` seconds."""
    latency: float
    seconds_per_byte: float

    def seconds(self, nbytes):
        """The time of an all-reduce of ``nbytes`` bytes (0 for none)."""
        return self.latency + self.seconds_per_byte * nbytes if nbytes > 0 else 0.0

    def describe(self):
        return (f"{1e-6 / max(self.seconds_per_byte, 1e-15):.1f} MB/s after "
                f"{1e3 * self.latency:.2f} ms")


def measure(comm, nbytes):
    """Rank 0's fit of in-place float32 sums of about ``nbytes`` (see the module docstring) on
    ``comm`` (an mpi4py communicator or ``hvdcomp.comm.transport.TorchTransport``); collective:
    every rank of ``comm`` calls it at the same point."""
    large = int(min(max(nbytes, SMALLEST), LARGEST)) // 4
    sizes = (max(large // 8, 1), large)
    buffers = [np.ones(n, dtype=np.float32) for n in sizes]
    comm.Allreduce(MPI.IN_PLACE, buffers[0])  # connections set up, not timed
    timed = []
    for buf in buffers:
        best = np.inf
        for _ in range(2):
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf)
            best = min(best, time.perf_counter() - t0)
        timed.append(best)
    (small, big), (t_small, t_big) = (4 * n for n in sizes), timed
    slope = (t_big - t_small) / (big - small)
    if slope <= 0:  # noise larger than the difference: all of it as bandwidth
        fit = (0.0, t_big / big)
    else:
        fit = (max(t_small - slope * small, 0.0), slope)
    return Link(*comm.bcast(fit, root=0))
