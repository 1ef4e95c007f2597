"""How many all-gathers hvdcomp's checks cost a compressed step, on real ranks through the stock
Horovod optimizer (rank script: tests/mpi/check_rounds.py): one, the batch agreement, which
also carries the sizes of the uncompressed sum. The methods that have per-tensor scalars
(Marsit, EF-signSGD, BinSGDM) gather them without waiting (the gather completes after their
own collective); a second all-gather that waits, of the statuses and the scalars, only where
some rank has a NaN/Inf (the step is then skipped on every rank)."""
import numpy as np
import pytest

from hvdcomp import registry
from hvdcomp.comm.context import Gathered
from mpirun import results, run

SCALARS = {m for m, cls in registry.METHODS.items() if cls().algorithm.n_scalars}


@pytest.fixture(scope="module")
def rounds():
    res = results(run(2, "check_rounds.py", timeout=240))
    assert sorted(res) == [0, 1]
    return res


def test_the_methods_with_scalars_are_the_sign_methods():
    assert SCALARS == {"Marsit", "EFSignSGD", "BinSGDM"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", list(registry.METHODS))
def test_a_compressed_step_waits_on_one_gather_of_checks_and_scalars_do_not_wait(rounds, m):
    steps = 4
    for r in rounds.values():
        assert r[f"{m}.identical"], m
        assert r[f"{m}.counts"] == {"agree": steps, "gather_checked": 0,
                                    "check_batch": steps if m in SCALARS else 0}, m


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", list(registry.METHODS))
def test_a_nan_on_one_rank_is_gathered_and_skips_the_step_everywhere(rounds, m):
    for r in rounds.values():
        assert r[f"{m}.nan_counts"] == {"agree": 1, "gather_checked": 1, "check_batch": 0}, m
        assert r[f"{m}.nan_unchanged"], m


@pytest.mark.timeout(300)
def test_a_gather_started_without_waiting_completes_across_a_ring(rounds):
    for r in rounds.values():
        assert r["iallgather"] == r["allgather"] == [[0, 1, 2], [10, 11, 12]]
        assert r["iallgather_then"] == 12.0
        assert r["ring"] == 3.0  # 1 + 2: the ring in between was not disturbed


def test_gathered_completes_once_and_then_derives_from_it():
    calls = []

    def complete():
        calls.append(1)
        return np.arange(6.0).reshape(2, 3)
    gathered = Gathered(complete)
    picked = gathered.then(lambda rows: rows[:, [2]])
    assert calls == []  # nothing waits before it is read
    assert picked[1, 0] == 5.0 and gathered[0, 1] == 1.0
    assert np.asarray(gathered).shape == (2, 3) and gathered.wait() is gathered.wait()
    assert calls == [1]
    assert Gathered.of(np.ones(2))[1] == 1.0
