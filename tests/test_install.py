"""The README's install path for a user who already trains with Horovod: ``pip install`` of this
checkout into an environment that already has torch, Horovod and mpi4py (here: a new virtualenv
that sees the set-up's stack through a ``.pth`` file, and nothing of this checkout), without a
package index; then a 2-rank training run with Marsit from the installed package."""
import json
import os
import subprocess
import sys
import sysconfig

import pytest

from mpirun import ROOT, mpi_env


@pytest.mark.timeout(300)
def test_pip_install_into_an_existing_horovod_environment_trains_two_ranks(tmp_path):
    env_dir = tmp_path / "env"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env_dir)],
                   check=True, timeout=60)
    python = str(env_dir / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True).stdout
    # the user's stack: torch, Horovod, mpi4py, numpy (and pip); hvdcomp's editable install in
    # it is a .pth file of that directory, which Python does not read from a path added this way
    with open(os.path.join(site.strip(), "stack.pth"), "w") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([python, "-c", "import importlib.util as u; "
                            "print(u.find_spec('hvdcomp') is None)"], cwd=tmp_path, env=env,
                           check=True, capture_output=True, text=True).stdout
    assert found.strip() == "True"  # nothing of the checkout before the install
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
                    ROOT], cwd=tmp_path, env=env, check=True, timeout=240)
    where = subprocess.run([python, "-c", "import hvdcomp; print(hvdcomp.__file__)"],
                           cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    assert where.stdout.startswith(str(env_dir)), where.stdout

    out = tmp_path / "run.json"
    ranks = mpi_env({"HVDCOMP_DECISION": "compress"})
    ranks.pop("PYTHONPATH", None)
    proc = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", python,
                           os.path.join(ROOT, "examples", "train_torch.py"), "--compression",
                           "marsit", "--epochs", "3", "--json", str(out)],
                          cwd=tmp_path, env=ranks, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["identical"] and summary["final"] > 0.5, summary  # it trains (0.1: chance)
    assert summary["bytes_per_step"] < summary["fp32_ring_bytes_per_step"] / 10, summary
