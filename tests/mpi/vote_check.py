"""Rank script: ``hvdcomp.comm.votes.vote_rows`` on real MPI ranks (mpi4py + NumPy only). For
several lengths (empty, shorter than the ranks, odd, large) and random votes, reports whether
the two rows vote exactly as an all-gather of every rank's bits does (sum of their ±1 values
== 2 sign(sum over ranks)), whether they are identical on every rank, and the bytes sent."""
import hashlib

import numpy as np
from mpi4py import MPI

from hvdcomp.backend import unpack_signs
from hvdcomp.comm import get_context
from hvdcomp.comm.votes import vote_rows
from report import report

ctx, world = get_context(), MPI.COMM_WORLD


def votes_of(rows, n):
    return sum((unpack_signs(r, 8 * n, "int32") for r in rows), np.zeros(8 * n, np.int32))


exact, identical, sent, ties = [], [], {}, 0
for n in (0, 1, 3, 13, 1001, 40000):
    rng = np.random.default_rng(7 * n + ctx.rank)
    bits = rng.integers(0, 256, n, dtype=np.uint8)
    if n == 13:  # whole bytes the same on every rank: unanimous votes
        bits[:4] = np.frombuffer(b"\x00\xff\x0f\xa5", np.uint8)
    want = np.sign(votes_of(world.allgather(bits), n))
    before = ctx.stats.bytes_sent
    rows = vote_rows(ctx, bits)
    sent[n] = ctx.stats.bytes_sent - before
    exact.append(bool(rows.shape == (2, n) and np.array_equal(votes_of(rows, n), 2 * want)))
    digest = hashlib.sha256(rows.tobytes()).hexdigest()
    identical.append(len(set(world.allgather(digest))) == 1)
    ties += int((want == 0).sum())
report(rank=ctx.rank, exact=exact, identical=identical, sent=sent, ties=ties)
