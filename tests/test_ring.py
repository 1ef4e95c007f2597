"""The custom MPI ring all-reduce on real Open MPI ranks (1 to 5, not only powers of two)."""
import pytest

from mpirun import results, run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks,yield_when_idle", [(1, "1"), (2, "1"), (3, "1"), (4, "1"),
                                                   (5, "1"), (3, "0")])
def test_ring_sum_and_marsit_merge(ranks, yield_when_idle):
    """Every check with hvdcomp's waits as the tests launch ranks (yield_when_idle: sleeping
    between tests, ``hvdcomp.comm.context.wait``) and, on 3 ranks, as MPI waits."""
    res = results(run(ranks, "ring_check.py", timeout=120,
                      env={"OMPI_MCA_mpi_yield_when_idle": yield_when_idle}))
    assert sorted(res) == list(range(ranks))
    assert all(r["yielding"] == (yield_when_idle == "1") for r in res.values())
    assert all(r["checks"] == 34 for r in res.values())
    if ranks > 1:
        assert all(r["zmax"] < 5.5 for r in res.values())
