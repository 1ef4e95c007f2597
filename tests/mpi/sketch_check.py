"""Rank script (any number of ranks): Count-Sketch linearity across ranks through the ring
all-reduce, and SketchFusion steps on NumPy arrays (``reduce_now``) checked against a NumPy
reference built from every rank's input (``wire="float32"``: exactly; the default float16 wire:
to float16's rounding, and its float32 fallback on overflow exactly); state_dict round trip."""
import hashlib

import numpy as np
from mpi4py import MPI

import hvdcomp
from hvdcomp.methods.sketchfusion import math as alg
from hvdcomp.methods.sketchfusion import sketch as cs
from hvdcomp.comm import get_context, ring_allreduce
from report import report

ctx = get_context()
size, rank = ctx.size, ctx.rank
world = MPI.COMM_WORLD


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# 1. Linearity across ranks: integer-valued inputs, sum of sketches == sketch of the sum.
n = 50_000
xs = [np.random.default_rng(100 + r).integers(-50, 50, n).astype(np.float32) for r in range(size)]
h = cs.hashes(n, 5, 1000, seed=3)
table = cs.sketch(xs[rank], h).reshape(-1)
ring_allreduce(ctx, table)
linear = bool(np.array_equal(table.reshape(5, 1000), cs.sketch(np.sum(xs, axis=0), h)))

# 2. SketchFusion steps: every rank's g is known to every rank (seeded), so each rank checks the
#    result against a reference that repeats the algorithm on the whole data.
n = 20_000
comp = hvdcomp.SketchFusion(ratio=0.01, rows=5, width=10, seed=7, wire="float32")
k, rows, cols = comp.shape_for(n)
hs = cs.hashes(n, rows, cols, 7)
memories = [np.zeros(n, np.float32) for _ in range(size)]
outputs, matches, conserved, state_after = [], [], [], None
for step in range(4):
    gs = [np.random.default_rng([step, r]).standard_normal(n).astype(np.float32) for r in range(size)]
    for r in range(size):  # 50 planted coordinates, heavy against the bucket noise
        # (sqrt(n / cols * size) ~ 5.5 here), shared by all ranks
        gs[r][np.arange(0, n, n // 50)] += 10.0
    if step == 2:
        state_after = comp.state_dict()
    out = comp.reduce_now("w", gs[rank], 1.0)
    outputs.append(out)
    a = [m + g for m, g in zip(memories, gs)]
    summed = cs.merge(*[cs.sketch(x, hs) for x in a])
    idx, _ = cs.heavy_hitters(summed, hs, k)
    ref = np.zeros(n, np.float32)
    ref[idx] = np.sum([x[idx] for x in a], axis=0) / size
    matches.append(float(np.abs(out - ref).max()))
    memories = [alg.apply(x, idx, np.zeros(k), size)[1] for x in a]
    mem = comp.state_dict()["state"]["w"]
    conserved.append(float(np.abs(np.sum(memories, axis=0) + size * ref - np.sum(a, axis=0)).max()))
    matches.append(float(np.abs(mem - memories[rank]).max()))
    if step == 0:  # memories are empty: the 50 planted coordinates must all be selected
        planted_hit = int(np.isin(np.arange(0, n, n // 50), np.flatnonzero(out)).sum())

# 3. state_dict round trip: restore the state of before step 2 and repeat steps 2 and 3.
comp2 = hvdcomp.SketchFusion(ratio=0.01, rows=5, width=10, seed=7, wire="float32")
comp2.load_state_dict(state_after)
replay = []
for step in (2, 3):
    gs = [np.random.default_rng([step, r]).standard_normal(n).astype(np.float32) for r in range(size)]
    for r in range(size):
        gs[r][np.arange(0, n, n // 50)] += 10.0
    replay.append(np.array_equal(comp2.reduce_now("w", gs[rank], 1.0), outputs[step]))
same_on_ranks = len(set(world.allgather(digest(*outputs)))) == 1
stats = comp.last_stats

# 4. The default float16 wire: the same steps, each rank's values rounded to float16 and every
#    hop's partial sum rounded once. The planted coordinates are found; the applied values are
#    the float32 sums to float16's rounding; mass is conserved to that rounding (each rank keeps
#    its own rounding in its memory); half the bytes. A step whose values overflow float16
#    (1e6 at one planted coordinate on rank 0) falls back to float32 on every rank: then the
#    float32 reference holds exactly.
half = hvdcomp.SketchFusion(ratio=0.01, rows=5, width=10, seed=7)
half_out, half_error, half_conserved, half_planted, half_bytes = [], [], [], [], []
memories = [np.zeros(n, np.float32) for _ in range(size)]
for step in range(4):
    gs = [np.random.default_rng([step, r]).standard_normal(n).astype(np.float32) for r in range(size)]
    for r in range(size):
        gs[r][np.arange(0, n, n // 50)] += 10.0
    if step == 3:
        gs[0][0] = 1e6
    out = half.reduce_now("w", gs[rank], 1.0)
    half_out.append(out)
    half_bytes.append(half.last_stats.bytes_sent)
    a = [m + g for m, g in zip(memories, gs)]
    idx = np.flatnonzero(out)
    ref = np.sum([x[idx] for x in a], axis=0) / size
    scale = np.sum([np.abs(x[idx]) for x in a], axis=0) / size  # bounds every partial sum
    # float16's unit roundoff u = 2^-11 of each value and of each of the size - 1 hops' partial
    # sums: |size * out - sum a| <= size * u * sum |a|; the memories keep all but the hops'
    bound = scale * size * 2.0 ** -11 + 1e-7
    half_error.append(float(np.max(np.abs(out[idx] - ref) / bound)))
    memories = world.allgather(half.state_dict()["state"]["w"])
    lost = np.sum(memories, axis=0)[idx] + size * out[idx] - np.sum(a, axis=0)[idx]
    half_conserved.append(float(np.max(np.abs(lost) / ((size - 1) * bound))))  # hops' rounding
    half_planted.append(int(np.isin(np.arange(0, n, n // 50), idx).sum()))
    if step == 3:  # the float32 fallback: float32's rounding, no float16 rounding left anywhere
        fallback_error = float(np.max(np.abs(out[idx] - ref) / (scale + 1e-7)))
        fallback_memory_zero = bool(np.all(memories[rank][idx] == 0))
half_same = len(set(world.allgather(digest(*half_out)))) == 1
report(rank=rank, linear=linear, max_error=max(matches), conserved=max(conserved),
       replay=replay, same_on_ranks=same_on_ranks, planted_hit=planted_hit, k=k,
       out_nonzero=int(np.count_nonzero(outputs[-1])), bytes_sent=stats.bytes_sent,
       fp32_sent=2 * (size - 1) * n * 4 // size, wire=(rows * cols + k) * 4,
       half_error=max(half_error), half_conserved=max(half_conserved), half_planted=half_planted,
       half_bytes=half_bytes, half_same=half_same, fallback_error=fallback_error,
       fallback_memory_zero=fallback_memory_zero)
