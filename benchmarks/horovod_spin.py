"""Rank script: what an idle Horovod costs the other MPI traffic of its process on shared cores.

hvdcomp's own collectives (the agreement all-gather, the ring's exchanges, the node stages'
barriers) are sequential small-message round trips on a duplicated communicator, run by a
framework thread while Horovod's background thread runs its coordination cycle
(``HOROVOD_CYCLE_TIME``) in the same process. This measures, in one launch, on every rank:

1. before ``hvd.init()``: the CPU seconds per second of an idle process, and the wall time of
   one round of hvdcomp's pattern (an ``Allgather`` of 2,000 float64 and a ring ``Sendrecv``
   of the same, on a duplicated ``COMM_WORLD``; ``--rounds`` rounds, a 2 ms pause between);
2. the same after ``hvd.init()``, Horovod idle (no tensor submitted).

Rank 0 prints the median and 90th percentile of the round (the slowest rank's) before and after,
their ratio, and each rank's idle CPU.

    mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 -x OMPI_MCA_mpi_yield_when_idle=1 \
        .venv/bin/python benchmarks/horovod_spin.py            # add -x HOROVOD_CYCLE_TIME=5

Readings: benchmarks/README.md ("An idle Horovod beside hvdcomp's round trips").
"""
import argparse
import os
import resource
import time

import numpy as np
from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)


def cpu_seconds():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def idle_cpu(seconds):
    """CPU seconds per wall second of this process over ``seconds`` of sleep."""
    start = cpu_seconds()
    time.sleep(seconds)
    return (cpu_seconds() - start) / seconds


def rounds(comm, n, numel=2000):
    """The slowest rank's wall time (s) of each of ``n`` rounds: an Allgather of ``numel``
    float64, then a Sendrecv of as many around the ring."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine, gathered, got = np.ones(numel), np.empty((size, numel)), np.empty(numel)
    times = []
    for _ in range(n):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allgather(mine, gathered)
        comm.Sendrecv(mine, dest=(rank + 1) % size, recvbuf=got, source=(rank - 1) % size)
        times.append(time.perf_counter() - start)
        time.sleep(0.002)
    return np.max(comm.allgather(np.array(times)), axis=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--idle-seconds", type=float, default=2.0)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    before = rounds(comm, args.rounds), idle_cpu(args.idle_seconds)
    import horovod.torch as hvd
    hvd.init()
    time.sleep(0.5)  # Horovod's background thread is running
    after = rounds(comm, args.rounds), idle_cpu(args.idle_seconds)
    cpus = comm.gather((before[1], after[1]), root=0)
    if comm.Get_rank() == 0:
        cycle = os.environ.get("HOROVOD_CYCLE_TIME", "default")
        print(f"{comm.Get_size()} ranks, HOROVOD_CYCLE_TIME={cycle}")
        for label, (times, _) in (("without Horovod", before), ("beside idle Horovod", after)):
            print(f"  round {label}: median {np.median(times) * 1e3:.3f} ms, p90 "
                  f"{np.percentile(times, 90) * 1e3:.3f} ms")
        print(f"  ratio of medians {np.median(after[0]) / np.median(before[0]):.1f}x, of p90 "
              f"{np.percentile(after[0], 90) / np.percentile(before[0], 90):.1f}x")
        print("  idle CPU s/s per rank, without / beside Horovod: "
              + ", ".join(f"{b:.2f} / {a:.2f}" for b, a in cpus))


if __name__ == "__main__":
    main()
