"""benchmarks/cost_model.py's fit and pooling (pure functions; no MPI). benchmarks/ goes at the
end of the path: tests/ has modules of the same names as some scripts (models), which stay the
tests' own when both folders are collected together (``make test``)."""
import json
import os
import sys

import numpy as np

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cost_model  # noqa: E402


def test_fit_recovers_the_coefficients_of_exact_points_and_bounds_the_largest_error():
    a, b, c, d = 1e-3, 1.2, 5e-9, 8e-3
    rng = np.random.default_rng(0)
    points = [(a * r + b * by / bw + c * n + d, r, by, bw, n)
              for r, by, bw, n in zip(rng.integers(2, 60, 12), rng.uniform(1e5, 1e7, 12),
                                      rng.choice([3.75e7, 1.25e8], 12), rng.uniform(1e6, 4e6, 12))]
    coef, rel = cost_model.fit(points)
    assert np.allclose(coef, [a, b, c, d], rtol=1e-3, atol=1e-9)
    assert np.max(np.abs(rel)) < 1e-6
    # one point 30% off: the largest error is shared out, not left on that point
    noisy = [(t * (1.3 if i == 0 else 1.0), *rest) for i, (t, *rest) in enumerate(points)]
    _, rel = cost_model.fit(noisy)
    assert np.max(np.abs(rel)) < 0.3 / 1.3


def test_pooled_points_take_the_median_of_the_runs_and_powersgd_vectors_are_left_out(tmp_path):
    def rec(method, seconds, columns=0):
        return {"method": method, "hosts": 2, "ranks_per_host": 2, "elements": 1000,
                "rate_bps": 1e9, "status": "ok", "seconds": seconds, "columns": columns,
                "link_bytes_per_host": 10.0 * seconds}
    runs = [[rec("Marsit", 1.0), rec("PowerSGD", 5.0), rec("PowerSGD", 2.0, columns=10)],
            [rec("Marsit", 3.0)], [rec("Marsit", 2.5)]]
    paths = []
    for i, run in enumerate(runs):
        path = tmp_path / f"raw{i}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in run))
        paths.append(str(path))
    recs = {r["method"]: r for r in cost_model.load(paths)}
    assert sorted(recs) == ["Marsit", "PowerSGD"]
    assert recs["Marsit"]["seconds"] == 2.5 and recs["Marsit"]["runs"] == 3
    assert recs["Marsit"]["link_bytes_per_host"] == 25.0
    assert recs["PowerSGD"]["seconds"] == 2.0 and recs["PowerSGD"]["columns"] == 10


def test_node_stages_split_the_work_into_the_shard_coded_and_every_element_passed():
    # hvdcomp's node stages: the method codes the rank's shard, the stages pass over everything
    assert cost_model.work("SketchFusion", 2, 4, 1000) == (250.0, 1000.0)
    # one rank per node, flat, or a method with its own stages: the whole gradient is coded
    for method, layout in (("SketchFusion", (4, 1)), ("SketchFusion@hierarchy=flat", (2, 2)),
                           ("BinSGDM", (2, 2)), ("hvd-fp32", (2, 2))):
        assert cost_model.work(method, *layout, 1000) == (1000.0, 0.0)
    # two work columns are fitted apart: a staged 2 x 2 and a flat 4 x 1 of the same size,
    # whose single-term fit would miss both, are recovered exactly
    a, b, c, e, d = 1e-3, 1.0, 1e-8, 2e-9, 5e-3
    points = []
    for n in (1e6, 4e6):
        for bw in (3.75e7, 1.25e8):
            for layout in ((2, 2), (4, 1)):
                codec, stage = cost_model.work("SketchFusion", *layout, n)
                rounds = cost_model.rounds("SketchFusion", *layout)
                t = a * rounds + b * 0.1 * n / bw + c * codec + e * stage + d
                points.append((t, rounds, 0.1 * n, bw, codec, stage))
    coef, rel = cost_model.fit(points)
    assert np.max(np.abs(rel)) < 1e-6 and np.allclose(coef, [a, b, c, e, d], rtol=1e-3)


def test_every_method_has_a_traffic_law():
    from hvdcomp import registry
    assert set(cost_model.LAWS) == set(registry.METHODS)
    assert {cost_model.law(f"{m}@hierarchy=flat") for m in registry.METHODS} <= set(cost_model.LAWS.values())
