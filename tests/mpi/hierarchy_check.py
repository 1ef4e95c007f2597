"""Rank script: hvdcomp.comm.hierarchy on real MPI ranks (mpi4py + NumPy only), for several node
layouts of the same world. Reports, per layout: the layout, per-leg bytes of one all-reduce of
N_BIG ±1 votes, exactness where the result must be exact, and rank identity; for 2 x 2 also
a statistical check that the estimate of the sum is unbiased, and a float (lossless) exchange
showing the module carries any encode/combine; for every layout, the merged inter leg
(``merge``, 3+ nodes) checked the same way. Raises (non-zero exit) on a failed check."""
import hashlib
import warnings

import numpy as np
from mpi4py import MPI

from hvdcomp.methods.binsgdm import math as alg
from hvdcomp.signs.merge import MarsitMerge
from hvdcomp.backend import pack_signs, unpack_signs
from hvdcomp.backend.bits import packed_nbytes
from hvdcomp.methods.binsgdm.method import ReferencePath, pack_votes
from hvdcomp.comm import get_context
from hvdcomp.comm.hierarchy import Hierarchy, HierarchyError, small_int_dtype
from report import report

N_BIG = 1 << 16
ctx = get_context()
world = MPI.COMM_WORLD
rank, size = ctx.rank, ctx.size


def same_everywhere(a):
    d = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    return len(set(world.allgather(d))) == 1


def votes(n, salt):
    rng = np.random.default_rng(1000 * salt + rank)
    return np.where(rng.random(n) < 0.5, 1, -1).astype(np.int8)


def one_bit_codec(step):
    """BinSGDM's inter-node codec: re-binarised node sums, 1 bit per element."""
    def encode(node_sum, shard):
        return pack_signs(alg.rebinarise(node_sum, shard.node_size, (7, step, rank, 1)))

    def combine(messages, shard):
        bits = [unpack_signs(row, shard.size, "int8") for row in messages]
        return alg.node_votes_total(bits, shard.node_size, small_int_dtype(size))
    return encode, combine


def merged_codec(step, h):
    """BinSGDM's codec with 3+ nodes: the re-binarised node sums merged along the inter ring
    (Marsit's merge); ``combine`` gets one row standing for every node."""
    encode, _ = one_bit_codec(step)

    def combine(messages, shard):
        bits = [unpack_signs(row, shard.size, "int8") for row in messages]
        weight = shard.node_size * shard.nodes // len(messages)
        return alg.node_votes_total(bits, weight, small_int_dtype(size))
    return encode, combine, MarsitMerge(7, step, h.node, (h.local_rank,))


def merged_checks(h):
    """The merged inter leg (``merge``): rows, traffic, identity, and unbiasedness (z-scores of
    the mean over REPS keys against the exact sum, per-element variance (N L)^2 - sum^2)."""
    encode, combine, merge = merged_codec(1, h)
    x = votes(N_BIG, 98)
    before = h.leg_stats()
    got = h.allreduce(x, encode, combine, small_int_dtype(size), merge=merge)
    inter = h.leg_stats()["inter"].since(before["inter"])
    narrow = h.allreduce(x, encode, combine, small_int_dtype(size), merge=merge,
                         intra_wire=(pack_votes, node_votes), message_nbytes=packed_nbytes)
    n, reps = 4096, 96
    x = votes(n, 6)
    want = exact_sum(x)
    acc = np.zeros(n)
    for r in range(reps):
        encode, combine, merge = merged_codec(100 + r, h)
        acc += h.allreduce(x, encode, combine, np.int8, merge=merge)
    var = float(size) ** 2 - want.astype(np.float64) ** 2
    noisy = var > 0
    z = (acc[noisy] / reps - want[noisy]) / np.sqrt(var[noisy] / reps)
    return dict(rows=h.message_rows(merge), identical=same_everywhere(got),
                narrow_same=bool(np.array_equal(narrow, got)),
                values=sorted(set(np.unique(got).tolist())), inter_sent=inter.bytes_sent,
                node_inter_sent=int(h.intra.comm.allreduce(inter.bytes_sent)),
                exact_where_certain=bool(np.array_equal(acc[~noisy] / reps, want[~noisy])),
                z_max=float(np.abs(z).max()), z2_mean=float((z ** 2).mean()),
                noisy=int(noisy.sum()))


def node_votes(rows, count):
    return ReferencePath.vote_sums(rows, count, 1, np.int8)


def exact_sum(x):
    out = np.empty(x.size, dtype=np.int64)
    world.Allreduce(x.astype(np.int64), out, op=MPI.SUM)
    return out


def run_layout(name, rpn, uneven="flat"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = Hierarchy(ctx, ranks_per_node=rpn, uneven=uneven)
    res = {"describe": h.describe(), "nodes": h.nodes, "local_size": h.local_size,
           "node_sizes": h.node_sizes, "flat_fallback": h.flat_fallback,
           "warned": [str(w.message) for w in caught], "peers": h.peers,
           "shares_memory": h.shares_memory, "local_rank": h.local_rank, "node": h.node,
           "intra_ranks": MPI.Group.Translate_ranks(h.intra.comm.Get_group(),
                                                    list(range(h.intra.size)), world.Get_group()),
           "inter_ranks": MPI.Group.Translate_ranks(h.inter.comm.Get_group(),
                                                    list(range(h.inter.size)), world.Get_group())}
    for n in (0, 1, 13, 1001):  # odd lengths, fewer elements than shards
        x = votes(n, n)
        got = h.allreduce(x, *one_bit_codec(0), out_dtype=small_int_dtype(size))
        assert got.shape == (n,) and same_everywhere(got), (name, n)
        if h.nodes == 1 or h.local_size == 1:
            assert np.array_equal(got, exact_sum(x)), (name, n)
        # BinSGDM's narrower wires (votes as bits inside the node; the nodes' messages gathered
        # back instead of the totals): the same result exactly
        narrow = h.allreduce(x, *one_bit_codec(0), out_dtype=small_int_dtype(size),
                             intra_wire=(pack_votes, node_votes), message_nbytes=packed_nbytes)
        assert narrow.dtype == got.dtype and np.array_equal(narrow, got), (name, n)
    x = votes(N_BIG, 99)
    before = h.leg_stats()
    parent_before = ctx.stats.snapshot()
    got = h.allreduce(x, *one_bit_codec(1), out_dtype=small_int_dtype(size))
    legs = {k: v.since(before[k]) for k, v in h.leg_stats().items()}
    parent = ctx.stats.since(parent_before)
    want = exact_sum(x)
    res.update(
        identical=same_everywhere(got), exact=bool(np.array_equal(got, want)),
        dtype=str(got.dtype), values=sorted(set(np.unique(got).tolist())),
        intra_sent=legs["intra"].bytes_sent, intra_recv=legs["intra"].bytes_recv,
        inter_sent=legs["inter"].bytes_sent, inter_recv=legs["inter"].bytes_recv,
        parent_sent=parent.bytes_sent,
        node_inter_sent=int(h.intra.comm.allreduce(legs["inter"].bytes_sent)))
    return h, res


out = {}
for name, rpn in (("2x2", 2), ("shared", None), ("1x4", 4), ("4x1", 1), ("uneven31", 3)):
    h, out[name] = run_layout(name, rpn)
    out[name]["merged"] = merged_checks(h)
    if name == "2x2":
        # Unbiasedness of the whole pipeline: mean over REPS keys of the estimate vs the exact
        # sum, as z-scores with the per-element variance sum_n (L^2 - s_n^2).
        n, reps = 4096, 96
        x = votes(n, 5)
        every = np.asarray(world.allgather(x), dtype=np.int64)
        node_sums = np.stack([every[2 * k:2 * k + 2].sum(axis=0) for k in range(h.nodes)])
        var = (h.local_size ** 2 - node_sums ** 2).sum(axis=0)
        acc = np.zeros(n)
        for r in range(reps):
            acc += h.allreduce(x, *one_bit_codec(100 + r), out_dtype=np.int8)
        mean, want = acc / reps, every.sum(axis=0)
        noisy = var > 0
        z = (mean[noisy] - want[noisy]) / np.sqrt(var[noisy] / reps)
        assert np.array_equal(mean[~noisy], want[~noisy])
        out[name].update(z_max=float(np.abs(z).max()), z2_mean=float((z ** 2).mean()),
                         noisy=int(noisy.sum()))
        # Any codec: float32 node sums sent losslessly as bytes give MPI's sum (to rounding).
        f = np.random.default_rng(rank).standard_normal(1000).astype(np.float32)
        got = h.allreduce(f, lambda s, shard: s.view(np.uint8),
                          lambda m, shard: m.view(np.float32).sum(axis=0))
        ref = np.empty_like(f)
        world.Allreduce(f, ref, op=MPI.SUM)
        out[name]["float_ok"] = bool(np.allclose(got, ref, atol=1e-5) and same_everywhere(got))
try:
    Hierarchy(ctx, ranks_per_node=3, uneven="error")
    out["error"] = None
except HierarchyError as exc:
    out["error"] = str(exc)
report(rank=rank, **out)
