"""Launch a script on several real MPI ranks (Open MPI's mpirun, or Horovod's horovodrun) under a
hard timeout, so that a hang fails the test instead of waiting. Used by the multi-rank tests."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_DIR = os.path.join(ROOT, "tests", "mpi")
PYTHON = sys.executable


def mpi_env(extra=None):
    """The environment for ranks: root allowed, one thread per rank, quiet TensorFlow."""
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    })
    env.update(extra or {})
    return env


class MPIRunError(AssertionError):
    def __init__(self, msg, proc):
        super().__init__(msg)
        self.proc = proc


def run(np_, script, *args, timeout=240, launcher="mpirun", env=None, expect_ok=True):
    """Run ``tests/mpi/<script>`` (or an absolute path) on ``np_`` ranks; return the
    CompletedProcess (stdout+stderr merged in ``.stdout``, where the ranks' lines can interleave
    mid-line; with mpirun also ``.rank_output``: {rank: that rank's stdout + stderr}, whole).
    Fails on a non-zero exit when ``expect_ok``, and always on a timeout."""
    path = script if os.path.isabs(script) else os.path.join(MPI_DIR, script)
    output_dir = tempfile.mkdtemp(prefix="hvdcomp-ranks-")
    if launcher == "mpirun":
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none",
               "--output-filename", output_dir, PYTHON, path, *map(str, args)]
    elif launcher == "horovodrun":
        cmd = [os.path.join(os.path.dirname(PYTHON), "horovodrun"), "-np", str(np_),
               "-H", f"localhost:{np_}", "--mpi", "--mpi-args=--oversubscribe --bind-to none",
               PYTHON, path, *map(str, args)]
    elif launcher == "horovodrun-gloo":  # Gloo-only: no MPI ranks (each process a singleton)
        cmd = [os.path.join(os.path.dirname(PYTHON), "horovodrun"), "-np", str(np_),
               "-H", f"localhost:{np_}", "--gloo", PYTHON, path, *map(str, args)]
    else:
        raise ValueError(launcher)
    fd, results_path = tempfile.mkstemp(prefix="hvdcomp-results-", suffix=".txt")
    os.close(fd)
    env = dict(env or {}, HVDCOMP_TEST_RESULTS=results_path)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=mpi_env(env), cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise AssertionError(f"{' '.join(cmd)} did not finish in {timeout}s (hang?)\n{out[-4000:]}")
    finally:
        rank_output = read_rank_output(output_dir)
        shutil.rmtree(output_dir, ignore_errors=True)
    proc.rank_output = rank_output
    with open(results_path) as fh:
        proc.results_text = fh.read()
    os.unlink(results_path)
    if expect_ok and proc.returncode != 0:
        raise MPIRunError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-6000:]}", proc)
    return proc


def read_rank_output(output_dir):
    """{rank: stdout + stderr} from mpirun's ``--output-filename`` tree (DIR/1/rank.N/std*)."""
    out = {}
    for rank_dir in glob.glob(os.path.join(output_dir, "*", "rank.*")):
        rank = int(rank_dir.rsplit(".", 1)[1])
        out[rank] = ""
        for stream in ("stdout", "stderr"):
            if os.path.exists(os.path.join(rank_dir, stream)):
                with open(os.path.join(rank_dir, stream), errors="replace") as fh:
                    out[rank] += fh.read()
    return out


run.launches_ranks = True  # tests/conftest.py's tiers


def results(proc, tag="RESULT", case=None):
    """The JSON objects the ranks reported (tests/mpi/report.py), by rank; with ``case``, those
    of that case only (a script that runs several cases in one launch reports each with
    ``case=``)."""
    import json
    out = {}
    for line in proc.results_text.splitlines():
        if line.startswith(tag + " "):
            obj = json.loads(line[len(tag) + 1:])
            if case is None or obj.get("case") == case:
                out[obj["rank"]] = obj
    return out


def shared(launch):
    """``launch`` (a function of hashable arguments that starts an MPI job) run once per
    arguments in one pytest run: every later call gets its result, or raises the exception it
    raised. Several parametrised tests then check their own cases of one launch (each case
    reported with ``case=``, ``results(proc, case=...)``) instead of paying the ranks' start-up
    (Python, torch or TensorFlow, Horovod, numba: 5-10 s per launch on 2 cores) each."""
    memo = {}

    def once(*args):
        if args not in memo:
            try:
                memo[args] = (launch(*args), None)
            except Exception as exc:  # noqa: BLE001 - handed to every test that shares it
                memo[args] = (None, exc)
        value, exc = memo[args]
        if exc is not None:
            raise exc
        return value
    once.__doc__ = launch.__doc__
    once.launches_ranks = True  # tests/conftest.py's tiers
    return once
