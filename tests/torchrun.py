"""Launch a script as a torchrun job of emulated hosts (one torchrun agent per host on this
machine, static rendezvous on 127.0.0.1) under a hard timeout: the DDP tests' launcher. No MPI.
"""
import json
import os
import socket
import subprocess
import sys

from mpirun import mpi_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(script, *args, hosts=2, per_host=2, timeout=300, env=None):
    """Run ``script`` (relative to the repository) on ``hosts`` x ``per_host`` ranks; return the
    ``RESULT`` objects rank 0 printed, in order. Fails on a non-zero exit or a timeout, with
    every host's output."""
    port = free_port()
    procs = [subprocess.Popen(
        [TORCHRUN, f"--nnodes={hosts}", f"--nproc-per-node={per_host}", f"--node-rank={n}",
         "--master-addr=127.0.0.1", f"--master-port={port}", os.path.join(ROOT, script),
         *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env=mpi_env(env)) for n in range(hosts)]
    outputs, failed = [], False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            failed = True
        outputs.append(out)
        failed = failed or p.returncode != 0
    if failed:
        raise AssertionError(f"torchrun {script} failed:\n" + "\n".join(
            f"--- host {n} ---\n{o[-6000:]}" for n, o in enumerate(outputs)))
    return [json.loads(line[len("RESULT "):]) for line in outputs[0].splitlines()
            if line.startswith("RESULT ")]


run.launches_ranks = True  # tests/conftest.py's tiers
