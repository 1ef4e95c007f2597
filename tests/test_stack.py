"""The real stack, no mocks: Horovod (built with PyTorch, TensorFlow, MPI, Gloo) on real ranks
launched by Open MPI's ``mpirun`` and by ``horovodrun``; mpi4py sharing the job with Horovod;
``horovodrun --check-build``.

Each launch runs one rank script from ``tests/mpi/stack_*.py`` which does all of a framework's
checks in one go (allreduce + training) and prints its raw numbers; every expectation is
computed here from the rank count, so every assertion can fail."""
import os
import re
import subprocess

import numpy as np
import pytest

from mpirun import PYTHON, ROOT, mpi_env, results, run

HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")


def rank_results(proc, np_):
    res = results(proc)
    assert sorted(res) == list(range(np_)), (
        f"expected a RESULT line from each of {np_} ranks, got {sorted(res)}\n{proc.stdout[-4000:]}")
    return res


def close(actual, expected, atol, what):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                               np.asarray(expected, dtype=np.float64), rtol=0, atol=atol,
                               err_msg=what)


# --- expectations shared by the torch and TF rank scripts (same inputs in both) -------------

def check_allreduce(res, n):
    base = np.arange(6, dtype=np.float64).reshape(2, 3)
    x64 = [base * (r + 1) + 10.0 * r for r in range(n)]
    x32 = [(base + 1.0) * (r + 1) for r in range(n)]
    xi = [np.arange(5, dtype=np.int64) * (r + 1) for r in range(n)]
    for r, o in res.items():
        assert o["size"] == n and o["local_rank"] == r, o
        assert o["mpi_enabled"] is True, "launched with MPI but Horovod is not using MPI"
        # integer-valued float64: exact
        assert np.array_equal(np.asarray(o["sum64"]), sum(x64)), (r, o["sum64"])
        close(o["avg64"], sum(x64) / n, 1e-12, f"rank {r} avg64")
        close(o["avg32"], sum(x32) / n, 1e-5, f"rank {r} avg32")
        assert o["sumint"] == sum(xi).tolist(), (r, o["sumint"])
        if "x64_after" in o:   # out-of-place allreduce left the input alone
            assert np.array_equal(np.asarray(o["x64_after"]), x64[r]), (r, o["x64_after"])


def check_training(res, n):
    root = res[0]
    # the per-rank initialisations really differed, so the broadcast did something
    assert np.abs(np.subtract(res[1]["own_init"], root["own_init"])).max() > 1e-3
    for r, o in res.items():
        close(o["init"], root["own_init"], 0, f"rank {r}: broadcast initial parameters")
        assert all(np.isfinite(o["losses"])), o["losses"]
    for r, o in res.items():
        close(o["final"], root["final"], 1e-6, f"rank {r} final parameters differ from rank 0")
    moved = np.abs(np.subtract(root["final"], root["init"])).max()
    assert moved > 1e-3, f"training did not change the parameters (max change {moved})"
    # SGD on the ranks' averaged gradients == serial SGD on all ranks' data at once
    close(root["final"], root["reference"], 2e-5, "distributed training vs serial reference")


# --- 1 + 3: PyTorch ----------------------------------------------------------------------

@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher,np_", [("mpirun", 2), ("mpirun", 4), ("horovodrun", 2)])
def test_torch_allreduce_and_distributed_optimizer(launcher, np_):
    proc = run(np_, "stack_torch.py", launcher=launcher, timeout=120)
    res = rank_results(proc, np_)
    check_allreduce(res, np_)
    check_training(res, np_)


# --- 2 + 3: TensorFlow -------------------------------------------------------------------

@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher,np_", [("mpirun", 2), ("mpirun", 4), ("horovodrun", 2)])
def test_tf_allreduce_and_distributed_gradient_tape(launcher, np_):
    proc = run(np_, "stack_tf.py", launcher=launcher, timeout=120)
    res = rank_results(proc, np_)
    check_allreduce(res, np_)
    check_training(res, np_)


# --- 4: mpi4py and Horovod in one job ------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("np_", [2, 4])
def test_mpi4py_and_horovod_interleaved(np_):
    proc = run(np_, "stack_mpi4py.py", timeout=60)
    res = rank_results(proc, np_)
    for r, o in res.items():
        assert o["mpi_initialized_before_hvd"] is True
        assert o["query_thread"] == o["thread_multiple"], "MPI not at MPI_THREAD_MULTIPLE"
        assert o["hvd_mpi_threads_supported"] is True and o["hvd_mpi_enabled"] is True
        assert o["hvd_size"] == o["mpi_size"] == np_
        assert o["hvd_rank"] == o["mpi_rank"] == r
        assert o["hvd1"] == sum(np.arange(4.0) + 100.0 * k for k in range(np_)).tolist()
        assert o["mpi"] == sum(np.arange(4.0) * (k + 1) for k in range(np_)).tolist()
        assert o["mpi_max"] == 7 * (np_ - 1) + 1
        close(o["hvd2"], [np.mean([k + 1.0 for k in range(np_)])] * 3, 1e-6, f"rank {r} hvd2")


# --- 5: horovodrun --check-build -----------------------------------------------------------

def parse_check_build(text):
    """{section: {name: available}} from the ``[X] Name`` / ``[ ] Name`` listing."""
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"^\[([ X])\]\s+(\S.*?)\s*$", line)
        if m and current is not None:
            sections[current][m.group(2)] = m.group(1) == "X"
        elif line.endswith(":") and not line.startswith("["):
            current = line[:-1]
            sections[current] = {}
    return sections


@pytest.mark.timeout(120)
def test_horovodrun_check_build():
    proc = subprocess.run([HOROVODRUN, "--check-build"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=90, env=mpi_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = parse_check_build(proc.stdout)
    assert "Horovod v" in proc.stdout, proc.stdout
    fw, ctl, ops = (s.get(k, {}) for k in
                    ("Available Frameworks", "Available Controllers", "Available Tensor Operations"))
    assert fw.get("PyTorch") is True, proc.stdout
    assert fw.get("TensorFlow") is True, proc.stdout
    assert ctl.get("MPI") is True, proc.stdout
    assert ops.get("MPI") is True, proc.stdout


# --- 6: plain Keras 3 (tf.keras is the keras package where TF_USE_LEGACY_KERAS is unset) ------

@pytest.mark.timeout(150)
def test_keras3_tape_reduces_and_keras3_optimizer_is_refused_on_every_rank():
    """With TensorFlow >= 2.16 and TF_USE_LEGACY_KERAS unset, a user's model is Keras 3:
    ``DistributedGradientTape`` reduces its gradients (exactly with Horovod's none; the same bits
    on every rank with hvdcomp), and Horovod's Keras ``DistributedOptimizer``, whose gradients
    Keras 3 would leave unreduced, raises on every rank saying what to install and set."""
    keras_major = subprocess.run([PYTHON, "-c", "import keras; print(keras.__version__)"],
                                 stdout=subprocess.PIPE, text=True, env=mpi_env()).stdout.strip()
    if not keras_major or int(keras_major.split(".")[0]) < 3:
        pytest.skip(f"keras {keras_major or 'absent'}: the 2023 stack (TensorFlow 2.15, Keras 2)")
    np_ = 2
    res = rank_results(run(np_, "keras3.py", timeout=120, env={"TF_USE_LEGACY_KERAS": "0"}), np_)
    mean = [np.mean([np.asarray(res[r]["local"][i]) for r in range(np_)], axis=0)
            for i in range(len(res[0]["local"]))]
    for r, o in res.items():
        assert o["variable_type"].startswith("keras."), o["variable_type"]  # Keras 3's variables
        for i, m in enumerate(mean):
            close(o["exact"][i], m, 1e-6, f"rank {r} tensor {i}: Horovod none's mean")
        assert o["marsit_finite"] and not o["marsit_equals_local"], r
        assert o["marsit_digest"] == res[0]["marsit_digest"], "ranks differ under hvdcomp"
        assert o["refusal"] and o["refusal"].startswith("ValueError"), o["refusal"]
        assert "tf-keras" in o["refusal"] and "TF_USE_LEGACY_KERAS=1" in o["refusal"], o["refusal"]


def test_the_package_metadata_admits_the_stack_it_is_tested_on():
    """setup.py's requirements admit the numpy, mpi4py, torch and TensorFlow installed here (a
    ``pip install hvdcomp[torch,tensorflow]`` must not pull another stack than the one tested)."""
    import ast
    import importlib.metadata
    import sys

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    call = next(n for n in ast.walk(ast.parse(open(os.path.join(ROOT, "setup.py")).read()))
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords
          if k.arg in ("install_requires", "extras_require", "python_requires")}
    wanted = kw["install_requires"] + kw["extras_require"]["torch"] + \
        kw["extras_require"]["tensorflow"]
    checked = []
    for req in map(Requirement, wanted):
        installed = importlib.metadata.version(req.name)
        release = installed.split("+")[0]  # torch's local tag (+cpu, +cu130)
        assert req.specifier.contains(release, prereleases=True), (str(req), installed)
        checked.append(req.name)
    assert {"numpy", "mpi4py", "torch", "tensorflow-cpu"} <= set(checked)
    python = ".".join(map(str, sys.version_info[:3]))
    assert SpecifierSet(kw["python_requires"]).contains(python), (kw["python_requires"], python)
