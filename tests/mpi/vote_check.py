"""Rank script: ``hvdcomp.methods.efsignsgd.votes.vote_rows`` and ``vote_counts`` on real MPI ranks (mpi4py +
NumPy only). For several lengths (empty, shorter than the ranks, odd, large) and random votes,
reports whether the two rows vote exactly as an all-gather of every rank's bits does (sum of
their ±1 values == 2 sign(sum over ranks)) and the totals equal that sum, whether both are
identical on every rank, and the bytes each sent."""
import hashlib

import numpy as np
from mpi4py import MPI

from hvdcomp.backend import unpack_signs
from hvdcomp.comm import get_context
from hvdcomp.methods.efsignsgd.votes import vote_counts, vote_rows
from report import report

ctx, world = get_context(), MPI.COMM_WORLD


def votes_of(rows, n):
    return sum((unpack_signs(r, 8 * n, "int32") for r in rows), np.zeros(8 * n, np.int32))


exact, identical, sent, ties = [], [], {}, 0
counted, counted_identical, counted_sent = [], [], {}
for n in (0, 1, 3, 13, 1001, 40000):
    rng = np.random.default_rng(7 * n + ctx.rank)
    bits = rng.integers(0, 256, n, dtype=np.uint8)
    if n == 13:  # whole bytes the same on every rank: unanimous votes
        bits[:4] = np.frombuffer(b"\x00\xff\x0f\xa5", np.uint8)
    total = votes_of(world.allgather(bits), n)
    want = np.sign(total)
    before = ctx.stats.bytes_sent
    totals = vote_counts(ctx, bits)
    counted_sent[n] = ctx.stats.bytes_sent - before
    counted.append(bool(totals.dtype == np.int32 and np.array_equal(totals, total)))
    counted_identical.append(
        len(set(world.allgather(hashlib.sha256(totals.tobytes()).hexdigest()))) == 1)
    before = ctx.stats.bytes_sent
    rows = vote_rows(ctx, bits)
    sent[n] = ctx.stats.bytes_sent - before
    exact.append(bool(rows.shape == (2, n) and np.array_equal(votes_of(rows, n), 2 * want)))
    digest = hashlib.sha256(rows.tobytes()).hexdigest()
    identical.append(len(set(world.allgather(digest))) == 1)
    ties += int((want == 0).sum())
report(rank=ctx.rank, exact=exact, identical=identical, sent=sent, ties=ties, counted=counted,
       counted_identical=counted_identical, counted_sent=counted_sent)
