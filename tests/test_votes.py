"""``hvdcomp.methods.efsignsgd.votes``: an exact majority vote of sign bits along a ring (EF-signSGD's
exchange from 3 ranks on), and the vote totals themselves (its mean of signs under Adam), as
pure functions and on real Open MPI ranks."""
import numpy as np
import pytest

from hvdcomp.methods.efsignsgd.votes import add_votes, count_bits, counts_pay, outcome, ring_bits, ring_pays
from mpirun import results, run


def test_ring_bits_grow_as_log_n_and_pay_from_three_ranks():
    assert ring_bits(3) == pytest.approx(5 / 3) and ring_bits(4) == pytest.approx(2.75)
    assert ring_bits(8) == pytest.approx(3.875)
    assert not ring_pays(1) and not ring_pays(2)
    assert all(ring_pays(n) for n in range(3, 200))
    assert ring_bits(256) < 2 * np.log2(256) + 1  # log N, where an all-gather sends 255


def test_count_bits_grow_as_log_n_and_pay_from_six_ranks():
    assert count_bits(2) == pytest.approx(1.5) and count_bits(4) == pytest.approx(3.5)
    assert count_bits(8) == pytest.approx(45 / 8)
    assert not any(counts_pay(n) for n in range(1, 6))  # 5: 4 bits, as the all-gather's
    assert all(counts_pay(n) for n in range(6, 200))
    assert count_bits(256) < 2 * np.log2(257) + 1


def test_planes_count_votes_and_outcome_rows_vote_alike():
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 4, 5, 8, 9):
        votes = rng.integers(0, 256, (size, 6), dtype=np.uint8)
        planes = votes[:1]
        for k in range(1, size):
            planes = add_votes(planes, votes[k], (k + 1).bit_length())
        count = sum(np.unpackbits(p).astype(int) << j for j, p in enumerate(planes))
        assert np.array_equal(count, np.unpackbits(votes, axis=1).sum(axis=0))
        rows = outcome(planes, size)
        pm = lambda r: np.unpackbits(r).astype(int) * 2 - 1  # noqa: E731
        assert np.array_equal(pm(rows[0]) + pm(rows[1]), 2 * np.sign(2 * count - size))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [2, 3, 4, 5])
def test_vote_rows_on_real_ranks(ranks):
    """Exact and identical on every rank for every length, the outcome rows and the totals;
    bytes sent per rank as ``ring_bits`` and ``count_bits`` say (to chunk rounding; 2 ranks and
    even sizes can tie)."""
    res = results(run(ranks, "vote_check.py", timeout=120))
    assert sorted(res) == list(range(ranks))
    for r in res.values():
        assert all(r["exact"]) and len(r["exact"]) == 6 and all(r["identical"])
        assert r["sent"]["0"] == 0
        assert abs(r["sent"]["40000"] - ring_bits(ranks) * 40000) <= 4 * ranks
        assert all(r["counted"]) and len(r["counted"]) == 6 and all(r["counted_identical"])
        assert abs(r["counted_sent"]["40000"] - count_bits(ranks) * 40000) <= 4 * ranks
    if ranks % 2 == 0:
        assert res[0]["ties"] > 0
