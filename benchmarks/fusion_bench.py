"""LayerFusion vs layer-wise compression: per-step time of SketchFusion and Marsit on a model with
many small layers and a few large ones, measured in the same run.

    mpirun -np 4 --oversubscribe --bind-to none .venv/bin/python benchmarks/fusion_bench.py

Per compressor it first fits the cost model ``latency + bytes / bandwidth`` of one compressed
reduction (encode + ring all-reduce + decode, timed on single buckets of a few sizes), then times
full steps with three bucketings of the same gradients: layer-wise (one reduction per layer),
``hvdcomp.fusion.plan_buckets`` (backward time per layer measured on a stand-in matmul), and one
bucket. The reductions here run on the calling thread, so nothing overlaps with the backward
pass: the measured gain is the per-message fixed cost fusion removes; the planner's estimate
(which assumes overlap) is printed next to it. A bucket is reduced through the compressor's
batch entry point (``_process`` on named NumPy entries), as a ``buckets=`` hook would do.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdcomp  # noqa: E402
from hvdcomp import fusion  # noqa: E402
from hvdcomp.compressor import Entry  # noqa: E402
from hvdcomp.frontends import numpy as np_adapter  # noqa: E402

SIZES = [1 << 20] + [4096] * 30 + [1 << 20] + [4096] * 30 + [1 << 19]  # elements, backward order


def reduce_bucket(comp, named):
    """One flush of ``comp`` over the (name, float32 array) pairs; returns the results."""
    entries = [Entry(name, a, np_adapter, comp.working_dtype) for name, a in named]
    comp._process(entries)
    return [comp._results.pop(e.ticket)[0] for e in entries]


def backward_times(sizes):
    """Seconds of a stand-in backward per layer (a matmul with about the layer's flops / 64)."""
    out = []
    for n in sizes:
        m = max(8, int(np.sqrt(n / 64)))
        a = np.ones((m, m), np.float32)
        t0 = time.perf_counter()
        a @ a
        out.append(time.perf_counter() - t0)
    return out


def step_time(comp, grads, buckets, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        for lo, hi in buckets:
            reduce_bucket(comp, [(f"l{i:03d}", grads[i]) for i in range(lo, hi)])
        best = min(best, MPI.COMM_WORLD.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return best


def main():
    rank = MPI.COMM_WORLD.Get_rank()
    rng = np.random.default_rng(rank)
    grads = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    nbytes = [4 * n for n in SIZES]
    bwd = backward_times(SIZES)
    bwd = list(np.max(MPI.COMM_WORLD.allgather(bwd), axis=0))
    for name, make in (("SketchFusion", lambda: hvdcomp.SketchFusion(min_compress_numel=0)),
                       ("Marsit", lambda: hvdcomp.Marsit(min_compress_numel=0))):
        comp = make()
        probe = [1 << 12, 1 << 16, 1 << 19, 1 << 21]
        secs = [step_time(make(), [np.ones(n, np.float32)], [(0, 1)]) for n in probe]
        lat, bw = fusion.fit_cost_model([4 * n for n in probe], secs)
        plan = fusion.plan_buckets(nbytes, bwd, latency=lat, bandwidth=bw)
        rows = [("layer-wise", fusion.layerwise(len(SIZES))), ("LayerFusion", plan.buckets),
                ("one bucket", [(0, len(SIZES))])]
        for label, buckets in rows:
            comp = make()  # fresh state per bucketing
            t = step_time(comp, grads, buckets)
            est = fusion.estimate(buckets, nbytes, bwd, lat, bw)
            if rank == 0:
                print(f"{name:12s} {label:12s} buckets {len(buckets):3d}  measured {t * 1e3:8.2f} "
                      f"ms/step  model {est * 1e3:8.2f} ms (latency {lat * 1e3:.2f} ms, "
                      f"{bw / 1e6:.0f} MB/s)", flush=True)


if __name__ == "__main__":
    main()
