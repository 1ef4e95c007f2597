"""The convergence benchmark's smoke setting (benchmarks/convergence.py --smoke) on 4 real
Horovod/MPI ranks, and the character-level LM example launched on its own with horovodrun."""
import csv
import json
import math
import os
import subprocess

from mpirun import ROOT, PYTHON, mpi_env, run

METHODS = ["none", "marsit", "topk"]


def test_convergence_smoke(tmp_path):
    out = tmp_path / "conv"
    proc = subprocess.run(
        [PYTHON, os.path.join(ROOT, "benchmarks", "convergence.py"), "--smoke", "--seeds", "1",
         "--methods", ",".join(METHODS[1:]), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=420, env=mpi_env(),
        cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for name in ("table.md", "table.csv", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "table.md").read_text()
    assert "**digits**" in table and "**charlm**" in table
    assert table in proc.stdout  # the table is printed

    with open(out / "table.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["task"], r["method"]) for r in rows] == \
        [(t, m) for t in ("digits", "charlm") for m in METHODS]
    for r in rows:
        assert r["failed"] == "0" and r["identical"] == "True", r
        assert math.isfinite(float(r["mean"])) and float(r["bytes_per_step"]) > 0, r
    by = {(r["task"], r["method"]): r for r in rows}
    for task in ("digits", "charlm"):
        base = by[(task, "none")]
        assert float(base["gap"]) == 0.0 and base["meets"] == "True"
        assert base["bytes_kind"] == "computed"
        assert float(base["bytes_per_step"]) == float(base["fp32_ring_bytes"])
        for m in METHODS[1:]:
            r = by[(task, m)]
            assert r["bytes_kind"] == "measured"
            # compressed: at least 2x fewer bytes than fp32 (SketchFusion's default 5% sketch
            # sends 0.35 of them, TopK 10% of Adam's momentum after a dense warm-up: ~1/3 here)
            assert float(r["bytes_per_step"]) < float(r["fp32_ring_bytes"]) / 2, r
    # Even a few steps learn something: digits beats chance (0.1), the LM beats its start.
    assert float(by[("digits", "none")]["mean"]) > 0.3
    for m in METHODS:
        with open(out / "raw" / f"charlm-{m}-s0.json") as fh:
            rec = json.load(fh)
        assert len(rec["summary"]["digests"]) == 4 and rec["summary"]["identical"]
        curve = [p["val_loss"] for p in rec["curve"]]
        assert curve[-1] < curve[0] <= math.log(200), (m, curve)  # 103 symbols: ln 103 ~ 4.6

    # --from rebuilds the same table from the saved runs without launching anything.
    again = subprocess.run(
        [PYTHON, os.path.join(ROOT, "benchmarks", "convergence.py"), "--smoke", "--methods",
         ",".join(METHODS[1:]), "--from", str(out), "--out", str(tmp_path / "again")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-2000:]
    assert (tmp_path / "again" / "table.md").read_text() == table


def test_charlm_example_standalone(tmp_path):
    """The example a user copies: launched with horovodrun, prints progress and a summary, and
    writes its --json log. 20 steps: under its Adam the first 10 are a dense warm-up."""
    log = tmp_path / "lm.json"
    proc = run(2, os.path.join(ROOT, "examples", "train_charlm.py"), "--compression", "marsit",
               "--steps", "20", "--eval-every", "10", "--json", str(log), launcher="horovodrun",
               timeout=240)
    assert "step 20/20 train loss" in proc.stdout
    assert "weights identical on all ranks: True" in proc.stdout
    rec = json.loads(log.read_text())
    assert [p["step"] for p in rec["curve"]] == [0, 10, 20]
    seconds = [p["seconds"] for p in rec["curve"]]  # the training seconds to each point
    assert seconds[0] == 0.0 < seconds[1] < seconds[2] <= rec["summary"]["seconds"], seconds
    s = rec["summary"]
    assert s["compression"] == "marsit" and s["ranks"] == 2 and s["bytes_kind"] == "measured"
    assert 0 < s["bytes_per_step"] < s["fp32_ring_bytes_per_step"]
    assert s["final"] == rec["curve"][-1]["val_loss"]
