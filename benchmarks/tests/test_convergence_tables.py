"""benchmarks/convergence.py's timing order and time-to-target tables (pure functions; no MPI).
Each test imports the script itself: importing it puts benchmarks/ and examples/ first on the
path, which must not happen while pytest still collects tests/ (tests/models.py)."""
import math
import os
import sys

import pytest

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/


@pytest.mark.parametrize("count", [2, 5, 8])
def test_timing_rounds_put_every_configuration_at_every_place_once_after_new_ones(count):
    """The timed runs' order (benchmarks/convergence.py ``timing_order``): over as many rounds
    as configurations, each runs once at each place, and a round holds each once; no
    configuration follows the same one in every round (a rotation kept every run's
    predecessor), and with an even count it follows each other one exactly once."""
    from convergence import timing_order
    every = ["none", "fp16", "marsit", "topk", "sketchfusion", "efsignsgd", "powersgd",
             "ceiling"][:count]
    rounds = [timing_order(every, k) for k in range(len(every))]
    assert all(sorted(r) == sorted(every) for r in rounds)
    for place in range(len(every)):
        assert sorted(r[place] for r in rounds) == sorted(every)
    pairs = [(r[i], r[i + 1]) for r in rounds for i in range(len(r) - 1)]
    after = {m: [a for a, b in pairs if b == m] for m in every}
    assert all(len(set(a)) > 1 for a in after.values() if len(a) > 1), after
    if count % 2 == 0:
        assert sorted(pairs) == sorted((a, b) for a in every for b in every if a != b)


def test_the_time_to_the_target_is_the_timed_runs_seconds_to_that_step():
    """``add_times``: where the timed runs' curves carry the seconds to each point, the time to
    the baseline's final quality is the median over the rounds of those seconds at the step that
    reaches it, plus the setup; a first step that is most of the job counts once, not spread
    over every step as steps x the mean step would. Records without them keep that estimate. The
    step time is the one held past the first point (the whole run's mean in older records)."""
    from convergence import add_times

    def run(method, first, step, setup=0.0, timed=True):  # 4 points of 10 steps each
        curve = [{"step": 10 * k, **({"seconds": first + (10 * k - 1) * step} if timed else {})}
                 for k in (1, 2, 3, 4)]
        return {"task": "t", "rate": "1gbit", "method": method, "curve": curve,
                "summary": {"seconds": first + 39 * step, "steps": 40, "setup_seconds": setup}}

    timing = [run("none", 5.0, 0.01), run("none", 7.0, 0.01), run("none", 6.0, 0.03),
              run("marsit", 5.5, 0.012, setup=0.5), run("marsit", 6.5, 0.012, setup=0.5),
              run("marsit", 6.0, 0.012, setup=0.5), run("old", 6.0, 0.01, timed=False)]
    rows = [{"task": "t", "method": "none", "steps_to_baseline": 20},
            {"task": "t", "method": "marsit", "steps_to_baseline": 40},
            {"task": "t", "method": "old", "steps_to_baseline": 20}]
    add_times(rows, timing, ["1gbit"])
    none, marsit, old = (r["times"]["1gbit"] for r in rows)
    assert none["to_baseline_how"] == marsit["to_baseline_how"] == "timed"
    assert math.isclose(none["to_baseline_s"], 6.0 + 19 * 0.03)  # the median round's seconds
    assert math.isclose(marsit["to_baseline_s"], 0.5 + 6.0 + 39 * 0.012)
    assert math.isclose(marsit["x_none"], marsit["to_baseline_s"] / none["to_baseline_s"])
    assert old["to_baseline_how"] == "steps x mean step"
    assert math.isclose(old["to_baseline_s"], 20 * (6.0 + 39 * 0.01) / 40)
    # the step column: the held step, past the first point (the median round's), where timed
    assert math.isclose(none["step_s"], 0.01) and math.isclose(marsit["step_s"], 0.012)
    assert math.isclose(old["step_s"], (6.0 + 39 * 0.01) / 40)


def test_each_round_is_compared_with_the_baselines_run_of_the_same_round():
    """``add_times``' paired ratios: each round's time of a method over Horovod none's in the same
    round (drift between rounds cancels), to each one's own step of the baseline's quality and
    for the whole run, matched by the records' round whatever their order; a round that one side
    lacks (a failed run) is left out; a method that does not reach the quality still gets its
    whole runs' ratios. In the table: the per-round range beside the median ratio."""
    from convergence import add_times, time_table

    def run(method, k, first, step, setup=0.0):  # 4 points of 10 steps each, round k
        curve = [{"step": 10 * j, "seconds": first + (10 * j - 1) * step} for j in (1, 2, 3, 4)]
        return {"task": "sgd-mlp", "rate": "1gbit", "method": method, "round": k, "curve": curve,
                "summary": {"seconds": first + 39 * step, "steps": 40, "setup_seconds": setup}}

    # round 2 is slow for everyone (drift); marsit's round 3 failed (no record)
    timing = [run("marsit", 2, 10.0, 0.02, 1.0), run("none", 1, 5.0, 0.01),
              run("none", 2, 9.0, 0.02), run("none", 3, 5.0, 0.01),
              run("marsit", 1, 5.0, 0.01, 1.0), run("late", 1, 5.0, 0.01),
              run("late", 2, 9.0, 0.02), run("late", 3, 5.5, 0.01)]
    rows = [{"task": "sgd-mlp", "method": "none", "steps_to_baseline": 20, "mean": 0.9,
             "gap": 0.0, "steps": 40},
            {"task": "sgd-mlp", "method": "marsit", "steps_to_baseline": 30, "mean": 0.9,
             "gap": 0.0, "steps": 40},
            {"task": "sgd-mlp", "method": "late", "steps_to_baseline": None, "mean": 0.8,
             "gap": -10.0, "steps": 40}]
    add_times(rows, timing, ["1gbit"])
    none, marsit, late = (r["times"]["1gbit"] for r in rows)
    to = {1: (1.0 + 5.0 + 29 * 0.01) / (5.0 + 19 * 0.01),
          2: (1.0 + 10.0 + 29 * 0.02) / (9.0 + 19 * 0.02)}
    assert len(marsit["x_none_rounds"]) == 2
    assert all(math.isclose(a, to[k]) for a, k in zip(marsit["x_none_rounds"], (1, 2)))
    whole = [(1.0 + 5.0 + 39 * 0.01) / (5.0 + 39 * 0.01),
             (1.0 + 10.0 + 39 * 0.02) / (9.0 + 39 * 0.02)]
    assert all(math.isclose(a, b) for a, b in zip(marsit["run_x_none_rounds"], whole))
    assert "x_none_rounds" not in late and len(late["run_x_none_rounds"]) == 3
    assert math.isclose(late["run_x_none_rounds"][2], (5.5 + 0.39) / (5.0 + 0.39))
    assert none["run_x_none_rounds"] == [1.0, 1.0, 1.0]
    table = time_table(rows, ["1gbit"])
    assert f"[{min(to.values()):.2f}-{max(to.values()):.2f}x]" in table
    assert f"{(whole[0] + whole[1]) / 2:.2f}x [{min(whole):.2f}-{max(whole):.2f}x]" in table
