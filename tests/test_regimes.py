"""The regimes benchmarks (benchmarks/regimes.py: PyTorch; regimes_tf.py: TensorFlow) in a tiny
setting on real Horovod/MPI ranks (4; 2 for TensorFlow's ResNet-50, whose traced steps cost each
rank about 20 s of CPU on this machine's 2 cores): every configuration timed, together or one at
a time beside the ceiling (``--sequential``), and report.py's table read from their records."""
import json
import os
import statistics
import subprocess

import pytest

from mpirun import PYTHON, ROOT, mpi_env, run

ROUNDS = 2


def launch(tmp_path, script, *args, ranks=4):
    out = tmp_path / "regimes.jsonl"
    run(ranks, os.path.join(ROOT, "benchmarks", script), *args, "--rounds", ROUNDS, "--steps", 1,
        "--warmup", 1, "--label", "t", "--out", out, timeout=400)
    with open(out) as fh:
        return [json.loads(line) for line in fh]


def check_records(records, methods, paired, ranks=4):
    """The records of one job; with ``paired``, the ceiling's is written again after each pair
    (all its rounds so far), and the last one counts."""
    by = {r["method"]: r for r in records}
    others = [m for m in methods if m != "ceiling"]
    assert sorted(by) == sorted(methods), records
    assert all(r["status"] == "ok" and r["ranks"] == ranks for r in records), records
    ceiling = by["ceiling"]
    if paired:
        assert [r["method"] for r in records] == [x for m in others for x in ("ceiling", m)]
        for i, r in enumerate(records[::2]):
            assert r["rounds"] == ceiling["rounds"][:ROUNDS * (i + 1)]
    else:
        assert len(records) == len(methods)
    assert len(ceiling["rounds"]) == ROUNDS * (len(others) if paired else 1)
    everything = statistics.median(ceiling["rounds"])
    for j, r in enumerate(records):  # r: against the ceiling's rounds when it was written
        so_far = ceiling["rounds"][:ROUNDS * (j // 2 + 1)] if paired else ceiling["rounds"]
        assert r["seconds"] == statistics.median(r["rounds"])
        assert r["r"] == pytest.approx(r["allreduce_seconds"] / statistics.median(so_far))
    for m in others:
        assert len(by[m]["rounds"]) == ROUNDS
    for i, m in enumerate(others):
        beside = by[m].get("ceiling_rounds")
        if paired:  # the ceiling's rounds of its own pair, in the order the pairs ran
            assert beside == ceiling["rounds"][ROUNDS * i:ROUNDS * (i + 1)]
            assert by[m]["ceiling_seconds"] == statistics.median(beside)
        else:
            assert beside is None and by[m]["ceiling_seconds"] == everything
    return by


def report(tmp_path, records):
    """report.py --regimes on the records: regimes.md's one row."""
    proc = subprocess.run([PYTHON, os.path.join(ROOT, "benchmarks", "report.py"), "--regimes",
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=mpi_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in (tmp_path / "regimes.md").read_text().splitlines()
            if line.startswith(f"| {records[0]['model']} | t |")]
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("paired", [True, False], ids=["sequential", "together"])
def test_regimes_torch(tmp_path, paired):
    methods = ["ceiling", "hvd-fp32", "hvd-fp16", "Marsit"]
    records = launch(tmp_path, "regimes.py", "--model", "gpt", "--layers", 1, "--seq", 8,
                     "--batch", 1, "--methods", ",".join(methods),
                     *(["--sequential"] if paired else []))
    by = check_records(records, methods, paired)
    assert by["Marsit"]["params"] == sum(  # embeddings + positions + 1 layer + final norm
        [8192 * 512, 8 * 512, 4 * 512 * 512 + 4 * 512 + 2 * 512 * 2048 + 2048 + 512 + 4 * 512,
         2 * 512])
    # the table: each cell's fraction of the ceiling (from its own pair where paired) and its
    # ratio to the better of Horovod's two
    frac = {m: by[m]["ceiling_seconds"] / by[m]["seconds"] for m in methods}
    best = max(frac["hvd-fp32"], frac["hvd-fp16"])
    row = report(tmp_path, records)
    assert f" {frac['Marsit']:.2f} ({frac['Marsit'] / best:.2f}x) " in row, row


def test_regimes_tensorflow_keras_without_horovods_baselines(tmp_path):
    """Keras's DistributedOptimizer (the benchmark's other TensorFlow path is the tape; one
    TensorFlow job here, on 2 ranks, to keep the suite short: on 4 it took 135-179 s, Marsit's
    first step 94 s of it); without Horovod's fp32 / fp16 in the job, the table gives fractions
    without ratios."""
    api, methods = "keras", ["ceiling", "Marsit"]
    records = launch(tmp_path, "regimes_tf.py", "--api", api, "--image", 32, "--batch", 2,
                     "--methods", ",".join(methods), "--sequential", ranks=2)
    by = check_records(records, methods, True, ranks=2)
    assert by["Marsit"]["model"] == f"tf-resnet50-{api}"
    assert by["Marsit"]["params"] == 25_583_592  # ResNet-50's trainable parameters
    frac = by["Marsit"]["ceiling_seconds"] / by["Marsit"]["seconds"]
    row = report(tmp_path, records)
    assert row.startswith(f"| tf-resnet50-{api} | t |")
    assert f" {frac:.2f} [" in row or f" {frac:.2f} C [" in row, row  # no "(...x)"
