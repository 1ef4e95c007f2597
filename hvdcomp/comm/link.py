"""How fast the ranks' network sums a buffer: an all-reduce timed at growing sizes.

``measure(comm)`` times the transport's in-place sum of float32 buffers: one untimed call (it
sets up the connections and lines the ranks up), then 8 KiB and 64 KiB, doubling from there
until a sum takes ``TARGET`` seconds or the buffer reaches ``LARGEST``; each size's time is the
fastest of two calls on the slowest rank (so every rank sees the same times and fits the same
line), and ``latency + seconds_per_byte * bytes`` is fitted through the smallest and the largest.

It is the cost of the collective a passed gradient goes through (Horovod's allreduce, DDP's
all-reduce: the same link, a ring algorithm alike), so ``Link.seconds(bytes)`` is a floor under
the exchange of a step that passes that many bytes: whatever overlaps it, those bytes cross the
link within the step. It is taken where nothing else is on the link (before the job's first
gradient is handed to Horovod or DDP), and takes about four times ``TARGET``: 0.1-0.3 s.
"""
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

SMALLEST, FIRST, LARGEST = 8 << 10, 64 << 10, 4 << 20  # bytes
TARGET = 0.05  # seconds: a sum this long is mostly bandwidth on links of 1 Mbit/s and more


@dataclass(frozen=True)
class Link:
    """An all-reduce of ``b`` bytes takes ``latency + seconds_per_byte * b`` seconds."""
    latency: float
    seconds_per_byte: float

    def seconds(self, nbytes):
        """The time of an all-reduce of ``nbytes`` bytes (0 for none)."""
        return self.latency + self.seconds_per_byte * nbytes if nbytes > 0 else 0.0

    def describe(self):
        """Its bandwidth and latency, for a log line."""
        return (f"{1e-6 / max(self.seconds_per_byte, 1e-15):.1f} MB/s after "
                f"{1e3 * self.latency:.2f} ms")


def measure(comm):
    """The ``Link`` of ``comm`` (an mpi4py communicator or
    ``hvdcomp.comm.transport.TorchTransport``), the same on every rank (see the module
    docstring); collective: every rank of ``comm`` calls it at the same point."""
    comm.Allreduce(MPI.IN_PLACE, np.zeros(SMALLEST // 4, dtype=np.float32))
    small = _timed(comm, SMALLEST)
    size, took = FIRST, _timed(comm, FIRST)
    while took < TARGET and size < LARGEST:
        size *= 2
        took = _timed(comm, size)
    slope = (took - small) / (size - SMALLEST)
    if slope <= 0:  # noise larger than the difference: all of it as bandwidth
        return Link(0.0, took / size)
    return Link(max(small - slope * SMALLEST, 0.0), slope)


def _timed(comm, nbytes):
    """The slowest rank's fastest of two in-place sums of ``nbytes`` bytes of float32."""
    buf = np.zeros(nbytes // 4, dtype=np.float32)
    best = np.inf
    for _ in range(2):
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf)
        best = min(best, time.perf_counter() - t0)
    return comm.allreduce(best, op=MPI.MAX)
