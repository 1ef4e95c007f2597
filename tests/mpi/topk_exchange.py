"""Rank script (NumPy only, no Horovod): the Top-K aggregate of ``hvdcomp.methods.topk.method.exchange`` on both
paths, bidirectional and not, against a reference recomputed here from every rank's message
(gathered with mpi4py) by an independent dict-based implementation of the documented rule:

- merge(a, b): sum values of equal indices (a's first), keep per tensor the k_t entries of
  largest |value|, ties broken by the smaller index;
- tree path: G = the set the reduction tree ends with (fold round for ranks beyond the largest
  power of two, then binomial rounds, receiver's partial first); allgather path: G = the top-k_t
  per tensor of the sum of all messages (rank order); unidirectional: G = union of all messages;
- value at j in G = sum over ranks of the values they sent at j.

Values are integer-valued float64 (many ties in magnitude, exact sums) or random float64 (sums
compared to 1e-12 where the summation order of the path may differ). Also checks bit-identity
across ranks and the per-rank byte counts. Raises on any failed check; reports counts."""
import hashlib
import math

import numpy as np
from mpi4py import MPI

from hvdcomp.comm import get_context
from hvdcomp.comm import context as context_mod
from hvdcomp.comm.tree import tree_schedule
from hvdcomp.methods.topk.method import exchange
from report import report

ctx = get_context()
rank, size = ctx.rank, ctx.size
world = MPI.COMM_WORLD
checks = 0


def ref_merge(a, b, bounds, ks):
    """Dict-based reference of the merge rule (ks None: keep all)."""
    out = dict(a)
    for j, v in b.items():
        out[j] = out[j] + v if j in out else v
    if ks is None:
        return out
    kept = {}
    for t, k in enumerate(ks):
        items = [(j, v) for j, v in out.items() if bounds[t] <= j < bounds[t + 1]]
        items.sort(key=lambda jv: (-abs(jv[1]), jv[0]))
        kept.update(items[:k])
    return kept


def ref_tree(msgs, bounds, ks):
    """The reduction tree of the module docstring, written out independently."""
    p2 = 1
    while 2 * p2 <= len(msgs):
        p2 *= 2
    parts = list(msgs)
    for j in range(len(msgs) - p2):
        parts[j] = ref_merge(parts[j], parts[p2 + j], bounds, ks)
    s = 1
    while s < p2:
        for v in range(0, p2, 2 * s):
            parts[v] = ref_merge(parts[v], parts[v + s], bounds, ks)
        s *= 2
    return ref_merge(parts[0], {}, bounds, ks)  # the root applies the rule once more


def reference(msgs, bounds, ks, path, bidirectional):
    """(sorted indices, exact sums) by the documented rule."""
    ks = ks if bidirectional else None
    if path == "tree":
        g = ref_tree(msgs, bounds, ks)
    else:
        g = {}
        for m in msgs:
            g = ref_merge(g, m, bounds, None)
        g = ref_merge(g, {}, bounds, ks)
    idx = np.array(sorted(g), dtype=np.int64)
    sums = np.array([math.fsum(m.get(j, 0.0) for m in msgs) for j in idx])
    return idx, sums


def message(rng, bounds, ks, integer, pool, over=2):
    """A rank's message: ``over / 2 * k_t`` ascending indices per tensor drawn from the first
    ``pool`` fraction of it (so ranks overlap), values integers in [-9, 9] \\ {0} or normal
    floats."""
    idx = []
    for t, k in enumerate(ks):
        n = bounds[t + 1] - bounds[t]
        span = max(k, int(pool * n))
        m = min(over * k // 2, span)
        idx.append(bounds[t] + np.sort(rng.choice(span, size=m, replace=False)))
    idx = np.concatenate(idx).astype(np.int64)
    if integer:
        val = rng.integers(1, 10, idx.size) * rng.choice([-1.0, 1.0], idx.size)
    else:
        val = rng.standard_normal(idx.size)
    return idx, val.astype(np.float64)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


cases = [  # (tensor sizes, ks, integer values, overlap pool)
    ([1000], [10], True, 0.02),
    ([1000], [10], False, 0.05),
    ([500, 3000, 64], [5, 30, 64], True, 0.03),
    ([50], [50], True, 1.0),
    ([20000, 7], [200, 1], False, 1.0),
    ([2000, 300], [20, 3], True, 0.02),  # messages of 1.5 k_t (the approx selector's maximum)
]
assert tree_schedule(1) == [] and sum(len(r) for r in tree_schedule(size)) == size - 1
assert len(tree_schedule(size)) == math.ceil(math.log2(size)) if size > 1 else True
for max_msg in (1 << 30, 40):
    context_mod.MAX_MESSAGE_BYTES = max_msg  # 40: every payload split into many messages
    for c, (sizes, ks, integer, pool) in enumerate(cases):
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        rng = np.random.default_rng(1000 * c + rank)
        idx, val = message(rng, bounds, ks, integer, pool, 3 if c == len(cases) - 1 else 2)
        if c == 2 and rank == size - 1 and size > 1:
            idx, val = idx[:0], val[:0]  # a rank with nothing to send
        msgs = [dict(zip(i.tolist(), v.tolist())) for i, v in world.allgather((idx, val))]
        for path in ("tree", "allgather"):
            for bidir in (True, False):
                before = ctx.stats.snapshot()
                gi, gs = exchange(ctx, (idx, val), bounds, ks, path, bidir)
                moved = ctx.stats.since(before)
                ri, rs = reference(msgs, bounds, ks, path, bidir)
                assert np.array_equal(gi, ri), (rank, c, path, bidir, gi, ri)
                if integer or (path == "allgather" and size <= 8):
                    # integer values: exact in any order; allgather sums in rank order, which
                    # fsum matches to the last bit for random floats only up to rounding
                    assert np.allclose(gs, rs, rtol=0, atol=0 if integer else 1e-12), \
                        (rank, c, path, bidir)
                else:
                    assert np.allclose(gs, rs, rtol=0, atol=1e-12), (rank, c, path, bidir)
                if bidir:
                    cuts = np.searchsorted(gi, bounds)
                    assert all(cuts[t + 1] - cuts[t] <= k for t, k in enumerate(ks))
                assert len(set(world.allgather(digest(gi, gs)))) == 1, "ranks disagree"
                # traffic: K = sum k_t entries of 8 bytes (int32 + float64 = 12 here)
                K, e, lg = sum(ks), 4 + 8, max(1, math.ceil(math.log2(size)))
                biggest = max(world.allgather(idx.size))
                if size > 1 and path == "tree" and bidir:
                    ring = 2 * 8 * math.ceil(K / size) * (size - 1)
                    bound = max(K, idx.size) * e + 16 + lg * (4 * K + 8) + ring
                    assert moved.bytes_sent <= bound, (moved, bound)
                    bound = lg * (max(K, biggest) * e + 16) + 4 * K + 8 + ring
                    assert moved.bytes_recv <= bound, (moved, bound)
                if size > 1 and path == "allgather":
                    assert moved.bytes_sent == idx.size * e * (size - 1) + 8 * (size - 1), moved
                checks += 1
context_mod.MAX_MESSAGE_BYTES = 1 << 30

# The tree's G is an approximation: on 3 ranks, rank 0 sends index 0 (value 5), the others
# index 1 (value 3 each, 6 in total). Every merge sees at most one copy of index 1 next to 5,
# so the tree keeps index 0, while the exact top-1 of the sum is index 1. Both apply the exact
# sum of what was sent at their choice.
if size == 3:
    bounds, ks = np.array([0, 10]), [1]
    idx, val = (np.array([0]), np.array([5.0])) if rank == 0 else (np.array([1]), np.array([3.0]))
    gt, st = exchange(ctx, (idx, val), bounds, ks, "tree")
    ga, sa = exchange(ctx, (idx, val), bounds, ks, "allgather")
    assert (gt.tolist(), st.tolist(), ga.tolist(), sa.tolist()) == ([0], [5.0], [1], [6.0])
    checks += 1

report(rank=rank, size=size, checks=checks)
