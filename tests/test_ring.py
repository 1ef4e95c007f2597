"""The custom MPI ring all-reduce on real Open MPI ranks (1 to 5, not only powers of two)."""
import pytest

from mpirun import results, run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_ring_sum_and_marsit_merge(ranks):
    res = results(run(ranks, "ring_check.py", timeout=120))
    assert sorted(res) == list(range(ranks))
    assert all(r["checks"] == 34 for r in res.values())
    if ranks > 1:
        assert all(r["zmax"] < 5.5 for r in res.values())
