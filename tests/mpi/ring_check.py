"""Rank script: the ring all-reduce against MPI's own Allreduce, and the Marsit merge's
properties. Prints one RESULT line per rank; raises (non-zero exit) on any failed check."""
import hashlib

import numpy as np
from mpi4py import MPI

from hvdcomp.signs.merge import MarsitMerge
from hvdcomp.backend import pack_signs, unpack_signs
from hvdcomp.comm import context, get_context, mpi_allreduce, ring_allreduce
from report import report

ctx = get_context()
rank, size = ctx.rank, ctx.size
world = MPI.COMM_WORLD
checks = 0


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def same_everywhere(a):
    ds = world.allgather(digest(a))
    assert len(set(ds)) == 1, f"rank {rank}: results differ between ranks"


# 1. Float sum == MPI_Allreduce (to rounding), odd sizes, fewer elements than ranks, large
#    messages split into pieces (MAX_MESSAGE_BYTES lowered to 64 bytes for one pass).
for max_msg in (1 << 30, 64):
    context.MAX_MESSAGE_BYTES = max_msg
    for n in (0, 1, 2, 3, 5, 17, 1000, 12347):
        for dtype in (np.float32, np.float64):
            x = np.random.default_rng(1000 * rank + n).standard_normal(n).astype(dtype)
            want = np.empty_like(x)
            world.Allreduce(x, want, op=MPI.SUM)
            before = ctx.stats.snapshot()
            got = ring_allreduce(ctx, x.copy())
            moved = ctx.stats.since(before)
            assert np.allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5), (n, dtype)
            same_everywhere(got)
            # Every rank sends 2 (size-1) chunks: at most 2 (size-1) * ceil(n/size) elements.
            bound = 2 * (size - 1) * -(-n // size) * x.itemsize
            assert moved.bytes_sent <= bound and moved.bytes_recv <= bound, (moved, bound)
            # MPI's own sum, in pieces of MAX_MESSAGE_BYTES: MPI_Allreduce's bits, alike
            # everywhere, counted as the ring's traffic
            before = ctx.stats.snapshot()
            summed = mpi_allreduce(ctx, x.copy())
            moved = ctx.stats.since(before)
            assert summed.tobytes() == want.tobytes() or max_msg == 64, (n, dtype)
            assert np.allclose(summed, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5), (n, dtype)
            same_everywhere(summed)
            assert moved.bytes_sent == 2 * (size - 1) * x.nbytes // size, (moved, n)
            checks += 1
context.MAX_MESSAGE_BYTES = 1 << 30

# 2. Marsit merge: every output bit is one of the ranks' bits at that position.
d = 100003
x = np.random.default_rng(rank).standard_normal(d).astype(np.float32)
own = pack_signs(x)
allbits = np.array(world.allgather(own))  # (size, nbytes)
out = ring_allreduce(ctx, own.copy(), MarsitMerge(seed=3, step=0, rank=rank))
same_everywhere(out)
any1 = np.bitwise_or.reduce(allbits, axis=0)
all1 = np.bitwise_and.reduce(allbits, axis=0)
assert not np.any(out & ~any1), "an output bit is 1 where every rank had 0"
assert not np.any(~out & all1), "an output bit is 0 where every rank had 1"
checks += 1

# 3. Unbiased: over many steps (seeds), the mean of the aggregated ±1 values matches the mean
#    over ranks of the signs, position by position, within a statistical bound.
d, steps = 4096, 300
# Rank r's sign at position i is + for ranks below a position-dependent cut: the true mean sign
# takes every value -1 + 2j/size.
cut = np.arange(d) % (size + 1)
signs = np.where(rank < cut, 1.0, -1.0).astype(np.float32)
true_mean = (2 * cut - size) / size
acc = np.zeros(d)
for s in range(steps):
    agg = ring_allreduce(ctx, pack_signs(signs).copy(), MarsitMerge(seed=11, step=s, rank=rank))
    acc += unpack_signs(agg, d, "float64")
est = acc / steps
z = (est - true_mean) / np.sqrt(np.maximum(1 - true_mean ** 2, 1e-12) / steps)
zmax = float(np.max(np.abs(z[np.abs(true_mean) < 1]), initial=0.0))
mean_err = float(np.mean(est - true_mean))
assert np.all(est[np.abs(true_mean) == 1] == true_mean[np.abs(true_mean) == 1])
assert size == 1 or zmax < 5.5, f"max |z| {zmax}"
assert abs(mean_err) < 5 / np.sqrt(steps * d), f"mean error {mean_err}"
checks += 1

report(rank=rank, size=size, checks=checks, zmax=zmax, mean_err=mean_err)
