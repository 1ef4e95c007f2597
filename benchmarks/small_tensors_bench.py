"""Rank script: the per-step overhead of hvdcomp on a model of many small tensors (issue 17,
case 8), through the stock ``hvd.DistributedOptimizer``.

The model is ``--tensors`` parameters of ``--numel`` elements each (default 1000 x 64: every one
below ``min_compress_numel``, so hvdcomp sums them uncompressed and the figure is pure per-tensor
overhead). A step is ``zero_grad``, a backward pass that gives every parameter a gradient, and
``opt.step()``. Compressions: Horovod's own ``none`` (the baseline) and ``fp16``, and every hvdcomp
method (``hvdcomp.registry`` when present, else the public classes), each with a fresh
optimizer. Rounds are interleaved (one block of ``--steps`` steps per compression per round,
after ``--warmup`` steps) so that machine noise hits every compression alike; a block's time is
the slowest rank's. Rank 0 prints, per compression, the median ms per step over rounds, the
spread (min-max) and the ratio to ``none`` measured in the same run.

    mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 -x OMPI_MCA_mpi_yield_when_idle=1 \
        .venv/bin/python benchmarks/small_tensors_bench.py --rounds 3

(``yield_when_idle``: two ranks share two cores here, so a rank waiting in MPI must not spin.)
"""
import argparse
import os
import statistics
import sys
import time

from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)

import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdcomp  # noqa: E402


def compressions():
    """(label, factory) of every compression compared, Horovod's first."""
    out = [("hvd-none", lambda: hvd.Compression.none), ("hvd-fp16", lambda: hvd.Compression.fp16)]
    try:
        from hvdcomp import registry
        methods = registry.METHODS
    except ImportError:
        methods = {n: getattr(hvdcomp, n) for n in hvdcomp.__all__
                   if isinstance(getattr(hvdcomp, n), type)
                   and issubclass(getattr(hvdcomp, n), hvdcomp.BatchedCompressor)
                   and getattr(hvdcomp, n) is not hvdcomp.BatchedCompressor}
    out += [(name, cls) for name, cls in methods.items()]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--numel", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    runs = []
    for label, make in compressions():
        params = [torch.nn.Parameter(torch.randn(args.numel)) for _ in range(args.tensors)]
        named = [(f"p{i:05d}", p) for i, p in enumerate(params)]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1e-3), named_parameters=named,
                                       compression=make())
        runs.append((label, params, opt))

    def step(params, opt):
        opt.zero_grad()
        torch.stack([p.sum() for p in params]).sum().backward()
        opt.step()

    times = {label: [] for label, _, _ in runs}
    for label, params, opt in runs:
        for _ in range(args.warmup):
            step(params, opt)
    for _ in range(args.rounds):
        for label, params, opt in runs:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(params, opt)
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            times[label].append(dt / args.steps * 1e3)
    if hvd.rank() == 0:
        base = statistics.median(times["hvd-none"])
        print(f"{args.tensors} tensors x {args.numel} elements, {hvd.size()} ranks, "
              f"{args.rounds} rounds x {args.steps} steps (ms per step, slowest rank)")
        print(f"{'compression':<14}{'median':>9}{'min':>9}{'max':>9}{'x none':>9}")
        for label, ts in times.items():
            med = statistics.median(ts)
            print(f"{label:<14}{med:9.2f}{min(ts):9.2f}{max(ts):9.2f}{med / base:9.2f}")


if __name__ == "__main__":
    main()
