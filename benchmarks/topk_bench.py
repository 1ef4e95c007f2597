"""Bidirectional Top-K: bytes per rank of the global top-k tree vs the all-gather baseline, and
the time of the fast (sampled-threshold) selection vs torch.topk, measured in the same run.

Launch with MPI ranks (oversubscribing is fine; the byte counts do not depend on it), e.g. from
the repository root::

    source scripts/mpi_env.sh
    mpirun -np 4 --oversubscribe --bind-to none .venv/bin/python benchmarks/topk_bench.py
    mpirun -np 8 --oversubscribe --bind-to none .venv/bin/python benchmarks/topk_bench.py

Options: ``--n`` (elements of the gradient, default 25M), ``--ratio`` (density, default 0.01),
``--repeat`` (timed repetitions, best kept). Every rank draws its own N(0, 1) float32 gradient.

What it prints (rank 0):
1. selection of k = ratio * n on one rank, timed while the other ranks sleep (not spin):
   torch.topk(|g|, k) (exact), the fast path ``hvdcomp.backend.topk.topk_approx`` on the same
   torch tensor (CPU tensors go through NumPy), the same fast path on Torch kernels only, and
   np.argpartition (exact), with the count the fast path returned;
2. ``hvdcomp.methods.topk.method.exchange`` of every rank's fast-path message, bidirectional, on the tree path
   and the all-gather path: bytes sent and received per rank (max and mean over ranks) and the
   wall time, next to what an fp32 ring all-reduce of the dense gradient would send per rank;
3. a full ``hvdcomp.TopK()`` compress/decompress step (default settings) on the same gradient,
   after one warm-up step (so with error-feedback memory): bytes and the encode/comm/decode split.
Times on an oversubscribed machine are not network times; the byte counts are exact.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdcomp  # noqa: E402
import hvdcomp.backend.topk as sel  # noqa: E402
from hvdcomp.methods.topk.math import target_count  # noqa: E402
from hvdcomp.comm import get_context  # noqa: E402
from hvdcomp.facade.frontends.numpy import named  # noqa: E402
from hvdcomp.methods.topk.method import exchange  # noqa: E402


def quiet_barrier(comm):
    """A barrier that sleeps instead of spinning, so waiting ranks leave the cores alone."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def best_time(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def selection_times(g, k, repeat):
    """Rows (name, seconds, count) for the selectors on this rank's gradient."""
    rows = []
    t, (v, _) = best_time(lambda: torch.topk(g.abs(), k, sorted=False), repeat)
    rows.append(("torch.topk(|g|, k) exact", t, v.numel()))
    t, (i, _) = best_time(lambda: sel.topk_approx(g, k, seed=1), repeat)
    rows.append(("fast path: topk_approx (default)", t, i.numel()))
    sel.CPU_VIA_NUMPY = False
    t, (i2, _) = best_time(lambda: sel.topk_approx(g, k, seed=1), repeat)
    sel.CPU_VIA_NUMPY = True
    rows.append(("fast path on Torch kernels only", t, i2.numel()))
    a = g.numpy()
    t, i3 = best_time(lambda: np.argpartition(np.abs(a), a.size - k)[a.size - k:], repeat)
    rows.append(("np.argpartition exact", t, i3.size))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ctx = get_context()
    comm, rank, size = ctx.comm, ctx.rank, ctx.size
    n, k = args.n, target_count(args.n, ratio=args.ratio)
    g = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    say = print if rank == 0 else (lambda *a, **kw: None)
    say(f"Top-K benchmark: {size} ranks, n = {n:,} float32 elements, ratio {args.ratio} "
        f"(k = {k:,}), best of {args.repeat}")

    # 1. selection on rank 0 alone
    if rank == 0:
        rows = selection_times(g, k, args.repeat)
        base = rows[0][1]
        say("\n1. selection on one rank (others asleep)")
        for name, t, c in rows:
            say(f"   {name:36s} {1e3 * t:8.1f} ms  {base / t:5.1f}x vs torch.topk  "
                f"count {c:,} ({100 * (c - k) / k:+.1f}% of k)")
    quiet_barrier(comm)

    # 2. exchange: tree vs all-gather, bidirectional, the same messages
    idx, val = sel.topk_approx(g, k, seed=rank)
    msg = (idx.numpy(), val.numpy())
    bounds, ks = [0, n], [k]
    fp32_ring = 2 * (size - 1) * 4 * n // size
    say(f"\n2. exchange of the fast-path messages (K = {k:,} entries per tensor, 8 B each)")
    say(f"   fp32 ring all-reduce of the dense gradient would send {fp32_ring / 1e6:9.2f} MB/rank")
    results = {}
    for path in ("tree", "allgather"):
        quiet_barrier(comm)
        before = ctx.stats.snapshot()
        t0 = time.perf_counter()
        gi, gs = exchange(ctx, msg, bounds, ks, path=path, bidirectional=True)
        wall = time.perf_counter() - t0
        moved = ctx.stats.since(before)
        sent = np.array(comm.allgather(moved.bytes_sent))
        recv = np.array(comm.allgather(moved.bytes_recv))
        walls = comm.allgather(wall)
        results[path] = (gi, gs)
        say(f"   {path:9s}: sent max {sent.max() / 1e6:7.2f} MB mean {sent.mean() / 1e6:7.2f} MB | "
            f"recv max {recv.max() / 1e6:7.2f} MB mean {recv.mean() / 1e6:7.2f} MB | "
            f"{max(walls) * 1e3:7.1f} ms | |G| = {gi.size:,}")
    overlap = np.intersect1d(results["tree"][0], results["allgather"][0]).size
    say(f"   tree G vs exact top-k of the sum (all-gather G): {overlap:,} of {k:,} indices shared")

    # 3. one full compressor step with the defaults
    comp = hvdcomp.TopK()
    arr = g.numpy()
    for _ in range(2):  # a warm-up step (first touch of fresh memory), then the measured one
        quiet_barrier(comm)
        ph, tk = comp.compress(named(arr, "g"))
        comp.decompress(ph, tk)
    st = comp.last_stats
    sent = np.array(comm.allgather(st.bytes_sent))
    phases = comm.allgather(st.phases)
    say("\n3. hvdcomp.TopK() second step (tree, bidirectional, approx selection)")
    ratio = f" ({fp32_ring / sent.max():.0f}x less than the fp32 ring)" if size > 1 else ""
    say(f"   sent max {sent.max() / 1e6:.2f} MB/rank{ratio}; phases (max over ranks): " +
        ", ".join(f"{p} {1e3 * max(ph[p] for ph in phases):.1f} ms" for p in sorted(phases[0])))


if __name__ == "__main__":
    main()
