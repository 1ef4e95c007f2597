"""Cross-framework agreement and fault behaviour on real MPI ranks."""
import atexit
import os
import shutil
import tempfile
import time

import numpy as np
import pytest

from hvdcomp import registry
from mpirun import results, run, shared

METHODS = list(registry.METHODS)  # every method of hvdcomp/registry.py


LOWER = sorted(m.lower() for m in METHODS)


@shared
def cross_framework_launch(framework):
    """The directory of one launch of tests/mpi/cross_framework.py (3 ranks) for every method."""
    directory = tempfile.mkdtemp(prefix=f"hvdcomp-cross-{framework}-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    run(3, "cross_framework.py", framework, directory, *LOWER, timeout=120 + 20 * len(LOWER))
    return directory


@pytest.mark.timeout(500)  # the first pays both frameworks' launches of every method
@pytest.mark.parametrize("method", LOWER)
def test_torch_and_tensorflow_give_the_same_aggregate(method):
    """Same inputs, seed and settings: PyTorch and TensorFlow front ends produce the same
    aggregate (one shared backend; Marsit's scale may differ in the last bits because the two
    frameworks sum |p| in different orders, so the tolerance is relative 1e-5). Every method of
    hvdcomp/registry.py, by its lower-case name."""
    a, b = (np.load(os.path.join(cross_framework_launch(framework), f"{method}.npy"))
            for framework in ("torch", "tf"))
    assert a.shape == b.shape == (3, 3001)
    assert np.count_nonzero(a) > 0
    assert np.array_equal(np.sign(a), np.sign(b))  # the same signs / positions were chosen
    assert np.allclose(a, b, rtol=1e-5, atol=0)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["kill", "raise", "stall"])
def test_a_dying_rank_ends_the_job_within_60s(mode):
    """The last rank is SIGKILLed, raises an uncaught exception, or froze a parameter (its
    optimizer would submit one gradient fewer: hvdcomp names it at the first gradient; the stall
    settings stay as a backstop): the job ends non-zero, without hanging."""
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "10"}
    t0 = time.monotonic()
    proc = run(3, "dying_rank.py", mode, timeout=120, expect_ok=False, env=env)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert elapsed < 60 + 15, elapsed  # 60 s bound after start-up (imports take ~10 s)
    out = "".join(proc.rank_output[rank] for rank in sorted(proc.rank_output))  # not interleaved
    if mode == "raise":
        assert "rank failure injected by the test" in out
        # hvdcomp's own line: Open MPI's "MPI_ABORT was invoked" help text is not reliably
        # printed (its show_help can fail with "Data unpack would read past end of buffer")
        assert ("hvdcomp: uncaught RuntimeError on rank 2 of 3; aborting the MPI job"
                in out), out[-3000:]
    if mode == "stall":  # named at the optimizer's first gradient, before Horovod can stall
        assert "ranks disagree about the parameters their optimizer reduces" in out, out[-3000:]
        assert "'4.bias' only on rank(s) [0, 1]" in out


@pytest.mark.timeout(150)
def test_gloo_only_launch_is_refused_on_every_rank():
    """horovodrun --gloo starts no MPI ranks (each process is an MPI singleton): every method
    raises LaunchError naming both worlds on every rank; Horovod itself keeps working."""
    res = results(run(2, "gloo_launch.py", timeout=120, launcher="horovodrun-gloo"))
    assert sorted(res) == [0, 1]
    for rank, r in res.items():
        assert r["size"] == 2 and r["plain"] == 2.0
        for m in METHODS:
            assert r[m] and r[m].startswith(
                f"{m}: Horovod runs 2 ranks (this is rank {rank}) but MPI has 1 (rank 0)"), r[m]
            assert "horovodrun --gloo" in r[m] and "horovodrun --mpi" in r[m]


@pytest.mark.timeout(150)
def test_world_of_one_rank_every_method():
    """Size 1 (HOROVOD_ELASTIC=1 so that the optimizer calls the compressor): no bytes move, the
    one-rank result of each method is exact, training steps go through the compressor."""
    r = results(run(1, "one_rank.py", timeout=120, env={"HOROVOD_ELASTIC": "1"}))[0]
    assert r["size"] == 1
    for m in METHODS:
        sent, same_shape, err = r[f"{m}.direct"]
        assert sent == 0 and same_shape and err <= 1e-6, (m, r[f"{m}.direct"])
        assert r[f"{m}.trained"] == [3, True], m
