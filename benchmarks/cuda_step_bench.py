"""Every method's step on CUDA gradients, on real MPI ranks sharing the GPU machine's GPUs.

    mpirun -np 2 python benchmarks/cuda_step_bench.py [--n 25000000] [--steps 5] [--methods ...]
        [--cpu] [--profile METHOD]

The GPU machines have no Horovod, so this times what a Horovod step drives: the compressor's batch
entry point ``reduce_batch_now(keys, tensors)`` with torch tensors on ``cuda:<rank % GPUs>`` (the
backend's Torch kernels; messages staged through host memory for MPI), for a gradient of ``--n``
float32 elements in two tensors (a square weight and its bias, the 2-layer MLP's size by default).
Baselines measured in the same run: the fp32 allreduce a CUDA-unaware MPI does (device to host,
``MPI_Allreduce``, host to device), and one device-to-device copy of the gradient (the unit of the
kernel cost). Rank 0 prints, per method: the first step, the median (min-max) of the timed steps,
the phases of the last step (``last_stats``: encode, communicate, decode), encode + decode in
device copies, and the step as a multiple of the fp32 allreduce's speed; with ``--cpu``, also the
NumPy memory a steady step allocates at its peak above what was live before it (tracemalloc), in
units of the gradient's bytes (the issue's "a steady step allocates no full-size array" would show
about 0). Communication here is shared memory between ranks on one machine, so the ratios show the
compute the method adds on a GPU, not a network's gain.
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdcomp  # noqa: E402

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
METHODS = ("Marsit", "EFSignSGD", "TopK", "BinSGDM", "SketchFusion")


def gradients(n, device):
    side = int(math.isqrt(n))
    rng = torch.Generator(device=device).manual_seed(RANK)
    return {"fc.weight": torch.randn(side, side, device=device, generator=rng),
            "fc.bias": torch.randn(n - side * side, device=device, generator=rng)}


def timed(fn, steps):
    """(first, [later]) seconds of ``fn()``, each ended by a device synchronisation and aligned
    across ranks by a barrier."""
    out = []
    for _ in range(steps + 1):
        COMM.Barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out[0], out[1:]


def mpi_fp32(grads):
    for g in grads.values():
        host = g.cpu().numpy()
        out = np.empty_like(host)
        COMM.Allreduce(host, out)
        g.copy_(torch.from_numpy(out).to(g.device, non_blocking=False) / COMM.Get_size())


def peak_allocation(fn):
    """The peak bytes NumPy allocated during ``fn()`` above what was live before it (tracemalloc;
    host arrays only: neither CUDA memory nor Torch's CPU allocator report there)."""
    import tracemalloc
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak - before


def profile(fn):
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    fn()
    torch.cuda.synchronize()
    prof.disable()
    if RANK == 0:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--cpu", action="store_true", help="CPU tensors instead (the host path)")
    ap.add_argument("--profile", default="", help="a method: rank 0 prints a cProfile of one "
                    "more step of it (the 15 costliest functions, cumulative)")
    args = ap.parse_args()
    if args.cpu:
        device = torch.device("cpu")
        torch.cuda.synchronize = lambda: None
        torch.cuda.get_device_name = lambda d: f"CPU ({os.cpu_count()} cores)"
    else:
        device = torch.device("cuda", RANK % torch.cuda.device_count())
        torch.cuda.set_device(device)
    grads = gradients(args.n, device)
    keys = sorted(grads)
    src = torch.cat([g.reshape(-1) for g in grads.values()])
    dst = torch.empty_like(src)
    copy = float(np.median(timed(lambda: dst.copy_(src), 10)[1]))
    _, base = timed(lambda: mpi_fp32({k: v.clone() for k, v in grads.items()}), args.steps)
    base = float(np.median(base))
    rows = []
    for name in args.methods.split(","):
        comp = getattr(hvdcomp, name)()
        step = lambda: comp.reduce_batch_now(keys, [grads[k] for k in keys])  # noqa: E731
        first, later = timed(step, args.steps)
        ph = comp.last_stats.phases
        peak = peak_allocation(step) if args.cpu else float("nan")
        rows.append((name, first, later, ph, peak / (4 * args.n)))
        if name == args.profile:
            profile(step)
    if RANK == 0:
        print(f"{COMM.Get_size()} ranks, {torch.cuda.get_device_name(device)}, n = {args.n:,} "
              f"float32 in 2 tensors, {args.steps} timed steps after the first; device copy "
              f"{copy * 1e3:.2f} ms; fp32 allreduce through host memory {base * 1e3:.1f} ms\n")
        print("| method | first step ms | step ms, median (min-max) | encode / comm / decode ms "
              "(last step) | encode+decode in device copies | x fp32 allreduce | NumPy peak "
              "allocation in a steady step, x gradient bytes |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, first, later, ph, alloc in rows:
            med = float(np.median(later))
            enc, com, dec = (ph.get(k, 0.0) for k in ("encode", "comm", "decode"))
            print(f"| {name} | {first * 1e3:.1f} | {med * 1e3:.1f} ({min(later) * 1e3:.1f}-"
                  f"{max(later) * 1e3:.1f}) | {enc * 1e3:.1f} / {com * 1e3:.1f} / "
                  f"{dec * 1e3:.1f} | {(enc + dec) / copy:.1f} | {base / med:.2f} | "
                  f"{alloc:.2f} |")


if __name__ == "__main__":
    main()
