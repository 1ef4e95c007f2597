"""The compress-or-pass decision (hvdcomp.decision): its rule on given periods (pure), and on real
ranks through the stock hvd.DistributedOptimizer (the same threshold on every rank, nothing of
the error-feedback memory lost over a switch, a bit-identical resume after a switch)."""
import math

import pytest

from conftest import decision_results, results, run
from hvdcomp import decision
from hvdcomp.comm.link import Link
from hvdcomp.decision import HALF, NEVER, Decision

MEASURE = {"HVDCOMP_DECISION": "measure"}
COMPRESS = {"HVDCOMP_DECISION": "compress"}


def feed(d, periods, numels=(16384, 2560, 10)):
    """Observe ``periods`` (``(steps, f(threshold in force, step))``, or a list), one step
    each, the first of a fresh decision with none (as the engine's first ``last_window``);
    returns the thresholds in force at each step."""
    seen = []
    for i in range(len(periods) if isinstance(periods, list) else periods[0]):
        seen.append(d.threshold)
        p = periods[i] if isinstance(periods, list) else periods[1](d.threshold, i)
        d.observe(0.0 if d.thresholds is None else p, numels)
    return seen


def test_candidates_go_from_every_tensor_to_none_with_the_half_of_the_elements_between():
    assert decision.candidates([16384, 2560, 256, 10], 1024) == [1024, 16384, NEVER]
    assert decision.candidates([5000, 5000], 1024) == [1024, NEVER]  # no size between
    assert decision.candidates([10, 20], 1024) == [1024, NEVER]
    assert decision.candidates([4, 3, 2, 1], 0) == [0, 3, NEVER]


def run_half(times, steps=40):
    """A decision offered the float16 pass (Horovod sums every passed tensor) fed ``times``
    (candidate -> seconds per step, ``HALF`` for it) for ``steps`` steps."""
    d = Decision("measure", 1024, margin=0.05)
    for _ in range(steps):
        key = HALF if d.passes_half() else d.threshold
        d.observe(0.0 if d.thresholds is None else times[key], (16384, 2560, 10), half=True)
    return d


def test_where_horovod_sums_every_passed_tensor_the_float16_pass_is_a_candidate():
    assert decision.candidates([16384, 2560, 10], 1024, half=True) == [1024, 16384, HALF, NEVER]
    d = run_half({1024: 0.02, 16384: 0.02, HALF: 0.010, NEVER: 0.015})
    assert d.phase == "hold" and d.passes_half() and d.threshold == NEVER
    assert d.as_dict()["half"] and "float16" in d.describe()
    again = Decision("measure", 1024)
    again.load(d.state())  # in the checkpoint
    assert again.passes_half() and again.phase == "hold"
    d = run_half({1024: 0.02, 16384: 0.02, HALF: 0.0097, NEVER: 0.0100})  # 3%: the exact sum
    assert d.phase == "hold" and not d.passes_half() and d.threshold == NEVER
    d = run_half({1024: 0.009, 16384: 0.02, HALF: 0.010, NEVER: 0.015})  # compressing wins
    assert d.phase == "hold" and d.threshold == 1024 and not d.passes_half()
    assert not d.as_dict()["half"]


@pytest.mark.parametrize("fastest", [1024, 16384, NEVER])
def test_the_probe_chooses_the_fastest_candidate_and_holds_it(fastest):
    d = Decision("measure", 1024)
    seen = feed(d, (40, lambda t, i: 0.010 if t == fastest else 0.020))
    assert d.phase == "hold" and d.threshold == fastest
    assert seen[:2] == [NEVER, NEVER]  # passing first; the first step has no period, the
    # second settles
    assert set(seen[-20:]) == {fastest}  # held: no flapping on a steady step time
    assert d.as_dict()["threshold"] == fastest


def test_compressing_for_good_is_a_choice_a_fixed_mode_or_a_finalist_not_a_screen_sample():
    """``decision.compresses_for_good`` (when the step engine loads the fused kernels): never while
    passing, nor for a compressing candidate's first-round sample (hopeless ones are dropped
    there, on the reference path); yes for a finalist in the second round, a held choice that
    compresses, and mode 'compress'."""
    d = Decision("measure", 1024)
    states = []
    for i in range(40):
        states.append((d.phase, d.round, d.threshold, decision.compresses_for_good(d)))
        d.observe(0.0 if d.thresholds is None else (0.010 if d.threshold == 1024 else 0.020),
                  (16384, 2560, 10))
    assert not any(good for _, _, t, good in states if t == NEVER)
    assert not any(good for phase, rnd, _, good in states if phase == "probe" and rnd == "screen")
    assert any(good for phase, rnd, t, good in states if rnd == "refine" and t == 1024)
    assert d.phase == "hold" and d.threshold == 1024 and decision.compresses_for_good(d)
    held = Decision("measure", 1024)
    feed(held, (40, lambda t, i: 0.010 if t == NEVER else 0.020))
    assert held.phase == "hold" and not decision.compresses_for_good(held)
    assert decision.compresses_for_good(Decision("compress", 1024))
    assert not decision.compresses_for_good(Decision("pass", 1024))


@pytest.mark.parametrize("step_seconds", [0.1, 1.0])
def test_a_finalist_loads_the_kernels_only_where_the_job_so_far_affords_their_load(
        monkeypatch, step_seconds):
    """``hvdcomp.engine.KernelLoading``: a compressing finalist of the probe's second round
    makes the fused kernels due only once ``AFFORDED`` seconds have passed since the first
    observed step (a short job is not charged numba's import for a candidate that may lose);
    a held choice that compresses makes them due at once."""
    from hvdcomp import engine
    monkeypatch.setattr(engine.kernels, "installed", lambda: True)
    monkeypatch.setattr(engine.kernels, "numba_loaded", lambda: False)
    d = Decision("measure", 1024)
    loading = engine.KernelLoading(object(), d)
    now = [0.0]
    loading.clock = lambda: now[0]
    seen = []
    for _ in range(40):
        d.observe(0.0 if d.thresholds is None else (0.010 if d.threshold == 1024 else 0.020),
                  (16384, 2560, 10))
        loading.observe(d)
        elapsed = -1.0 if loading.since is None else now[0] - loading.since
        seen.append((d.phase, d.round, d.threshold, elapsed, loading.due))
        now[0] += step_seconds
        if loading.due:
            break
    finalist = [(t, due) for phase, rnd, t, _, due in seen if phase == "probe"
                and rnd == "refine" and t == 1024]
    assert finalist, seen
    assert all(due == (elapsed >= loading.AFFORDED) for phase, rnd, t, elapsed, due in seen
               if phase == "probe"), seen
    if step_seconds == 0.1:  # 10 s not reached in the probe: loaded for the held choice
        assert not any(due for _, due in finalist), seen
        assert seen[-1][0] == "hold" and seen[-1][2] == 1024 and seen[-1][4], seen
    else:  # the probe's second round comes after 10 s: its finalist loads them
        assert seen[-1][:3] == ("probe", "refine", 1024) and seen[-1][4], seen


def test_a_tie_goes_to_the_exact_sum_and_compression_must_win_by_the_margin():
    d = Decision("measure", 1024, margin=0.05)
    feed(d, (20, lambda t, i: 0.0100 if t == NEVER else 0.0097))  # 3% faster: not enough
    assert d.threshold == NEVER
    d = Decision("measure", 1024, margin=0.05)
    feed(d, (20, lambda t, i: 0.0100 if t != 1024 else 0.0090))  # 10% faster: compress
    assert d.threshold == 1024
    d = Decision("measure", 1024, margin=0.05)
    feed(d, (20, lambda t, i: 0.0100 if t == NEVER else 0.0090))  # a tie of two: less of it
    assert d.threshold == 16384


def test_a_hopeless_candidate_is_dropped_after_one_sample():
    """The screen gives each candidate a settle step and one sample; only those within 1 +
    abort of the best take the rest. A hopeless candidate costs two steps whichever side of the
    fastest it lies: compressing more (passing wins) or less (compressing wins)."""
    d = Decision("measure", 1024, samples=3, settle=1, abort=0.5)
    seen = feed(d, (20, lambda t, i: 0.01 if t == 1024 else 0.10))
    # 1 (no period) + 1 settle + 1 sample of passing (in force at the start), 1 settle + 1
    # sample of each other, then 1 settle + 2 samples of 1024, held.
    assert seen[:12] == [NEVER] * 3 + [1024] * 2 + [16384] * 2 + [1024] * 5
    assert d.phase == "hold" and d.threshold == 1024
    d = Decision("measure", 1024, samples=3, settle=1, abort=0.5)
    seen = feed(d, (20, lambda t, i: 0.01 if t == NEVER else 0.10))
    # The finalist, no longer in force, settles again and takes its last 2 samples.
    assert seen[:10] == [NEVER] * 3 + [1024] * 2 + [16384] * 2 + [NEVER] * 3
    assert sum(t != NEVER for t in seen) == 4  # before the rounds: 9 steps compressing
    assert d.phase == "hold" and d.threshold == NEVER


def feed_as_the_engine(d, steps, times, first_extra, numels=(16384, 2560, 10)):
    """As the step engine feeds a decision: a step runs the threshold in force as it begins,
    and observes the previous step's window; a candidate's first step after a switch
    takes ``first_extra[threshold]`` more (Horovod negotiates its changed tensors anew)."""
    ran, seen = None, []
    for _ in range(steps):
        t = d.threshold  # its tensors were handed over in the backward pass, before observe
        seen.append(t)
        d.observe(0.0 if ran is None else ran[1], numels)
        ran = (t, times[t] + (first_extra[t] if ran is not None and ran[0] != t else 0.0))
    return seen


def test_a_candidates_slow_first_step_does_not_decide_the_screen():
    """Compressing every tensor is the fastest (10 ms) but its first step after a switch costs
    50 ms more (the largest tensors': 10 ms more): counted as its one screen sample (settle 1),
    it would be dropped for the largest tensors (14 ms); the default settles past it."""
    times = {1024: 0.010, 16384: 0.014, NEVER: 0.030}
    extra = {1024: 0.050, 16384: 0.010, NEVER: 0.010}
    d = Decision("measure", 1024, settle=1)
    feed_as_the_engine(d, 40, times, extra)
    assert d.phase == "hold" and d.threshold == 16384  # what a single first step shows
    d = Decision("measure", 1024)
    feed_as_the_engine(d, 40, times, extra)
    assert d.phase == "hold" and d.threshold == 1024
    assert d.medians[0] == pytest.approx(0.010)


def test_a_revisit_samples_the_choice_in_force_without_settling():
    d = Decision("measure", 1024, samples=3, settle=1, abort=0.5, revisit=10, budget=100)
    feed(d, (10, lambda t, i: 0.01 if t == NEVER else 0.10))
    assert d.phase == "hold" and d.threshold == NEVER
    seen = feed(d, (30, lambda t, i: 0.01 if t == NEVER else 0.10))
    assert d.phase == "hold" and d.threshold == NEVER and d.switches == 0
    # one revisit: the choice's sample (no settle), 2 steps of each other, the choice's 2 more
    assert sum(t != NEVER for t in seen) == 4, seen


def test_a_choice_that_gets_faster_is_the_new_reference_not_a_probe():
    d = Decision("measure", 1024, settle=1, revisit=10_000)
    feed(d, (12, lambda t, i: 0.011 if t == NEVER else 0.030))  # slow first steps
    assert d.phase == "hold" and d.threshold == NEVER
    seen = feed(d, (60, lambda t, i: 0.004 if t == NEVER else 0.030))
    assert set(seen) == {NEVER} and d.phase == "hold"  # no probe
    assert d.medians[d.chosen] == pytest.approx(0.004)
    # the others' medians were scaled alike (to ~0.011): a rise to them probes
    assert d.medians[0] == pytest.approx(0.030 * 0.004 / 0.011)
    seen = feed(d, (20, lambda t, i: 0.012 if t == NEVER else 0.030))  # 3x the reference
    assert any(t != NEVER for t in seen)  # a probe


def test_revisits_are_spaced_so_that_probing_costs_at_most_the_budget():
    """The probe's two other candidates cost 2 steps x 40 ms each over the choice: with a 1%
    budget of a 10 ms exchange, no revisit before 1600 steps (capped at 16 x revisit); with a
    50% budget, 32 steps would do: the regular 200."""
    d = Decision("measure", 1024, settle=1, revisit=200, budget=0.01)
    feed(d, (10, lambda t, i: 0.01 if t == NEVER else 0.05))
    assert d.phase == "hold" and d.threshold == NEVER and d.interval == 1600
    seen = feed(d, (1599, lambda t, i: 0.01 if t == NEVER else 0.05))
    assert set(seen) == {NEVER}  # held: no revisit within the interval
    d = Decision("measure", 1024, settle=1, revisit=200, budget=0.01)
    feed(d, (10, lambda t, i: 0.01 if t == NEVER else 1.0))
    assert d.interval == 16 * 200  # the cap
    d = Decision("measure", 1024, settle=1, revisit=200, budget=0.5)
    feed(d, (9, lambda t, i: 0.01 if t == NEVER else 0.05))
    assert d.interval == 200  # the probe is cheap enough for the regular revisit
    d = Decision("measure", 1024, settle=1, revisit=200, budget=0.01)
    feed(d, (30, lambda t, i: 0.01 if t == NEVER else 0.014))  # finalists: a close choice
    assert d.threshold == NEVER and d.interval == 200


def test_finalists_within_the_noise_of_their_samples_take_more_before_the_choice():
    """Passing and compressing the largest tensors alternate between 8 and 14 ms, and 9 and
    13 ms (their medians closer than half their ranges): they take up to ``retakes`` more rounds
    of samples before the choice. Steady ones (10 and 11.5 ms) take none."""
    def probe(times):
        d = Decision("measure", 1024, samples=3, retakes=2)
        seen = feed(d, (60, times))
        assert d.phase == "hold" and d.extra == 0
        return d, seen

    steady = {NEVER: 0.010, 16384: 0.0115, 1024: 0.05}
    d, seen = probe(lambda t, i: steady[t])
    quiet_len = max(k for k, t in enumerate(seen) if t == 16384)
    assert d.threshold == NEVER and len(d.taken[1]) == 3
    noisy = {NEVER: (0.008, 0.014), 16384: (0.009, 0.013)}
    d, seen = probe(lambda t, i: noisy[t][i % 2] if t in noisy else 0.05)
    assert len(d.taken[1]) == 9 and len(d.taken[2]) == 9  # two more rounds each
    assert max(k for k, t in enumerate(seen) if t == 16384) > quiet_len + 6


def test_close_candidates_are_revisited_regularly_and_far_ones_within_the_budget():
    """Passing (10 ms) and compressing the largest tensors (12 ms) are close, compressing every
    tensor (50 ms) is far: the regular revisits (200 steps, doubling) run the close pair only
    (light probes), and the far candidate runs again only once a full probe costs at most the
    1% budget: its 2 steps x 40 ms over the choice, every 800 steps."""
    times = {NEVER: 0.010, 16384: 0.012, 1024: 0.050}
    d = Decision("measure", 1024, settle=1, revisit=200, budget=0.01)
    feed(d, (12, lambda t, i: times[t]))
    assert d.phase == "hold" and d.threshold == NEVER
    assert d.interval == 200 and d.full_due - d.steps == 800
    seen = feed(d, (780, lambda t, i: times[t]))
    assert 1024 not in seen and 16384 in seen  # light probes only
    seen = feed(d, (120, lambda t, i: times[t]))
    assert 1024 in seen and d.threshold == NEVER  # the full probe
    # The wire slows as a light probe begins (passing and the close candidate, 60 ms): the
    # probe finds the choice no faster than the far candidate was, and a full probe follows.
    d = Decision("measure", 1024, settle=1, revisit=200, budget=0.01)
    feed(d, (12, lambda t, i: times[t]))
    slow = {NEVER: 0.060, 16384: 0.060, 1024: 0.050}
    feed(d, (200, lambda t, i: times[t]))
    assert d.phase == "probe" and d.queue == [d._index()] + d._close()  # the light probe
    seen = feed(d, (40, lambda t, i: slow[t]))
    assert 1024 in seen and d.threshold == 1024


def test_noise_within_the_band_keeps_the_choice_and_a_drift_probes_again():
    d = Decision("measure", 1024, drift=0.25, revisit=10_000)
    noisy = [0.010, 0.012, 0.009, 0.011]
    feed(d, (60, lambda t, i: (noisy[i % 4] if t == NEVER else 0.030)))
    assert d.phase == "hold" and d.threshold == NEVER and d.switches == 0
    # The step time of the choice quadruples (the wire got 4x slower; compressing, which sends
    # less, only a little slower): probed again, compressed.
    feed(d, (40, lambda t, i: {NEVER: 0.040, 16384: 0.036}.get(t, 0.032)))
    assert d.threshold == 1024 and d.switches == 1


def test_a_rise_that_leaves_the_choice_faster_than_the_others_were_does_not_probe():
    """Busy cores or a noisy neighbour: the choice's step time rises well past the band but
    stays under what the other candidates were measured at (they would be slowed too): no
    probe, whose compressing steps would cost more than they could find."""
    d = Decision("measure", 1024, settle=1, drift=0.25, revisit=10_000)
    feed(d, (12, lambda t, i: 0.010 if t == NEVER else 0.030))
    assert d.phase == "hold" and d.threshold == NEVER
    seen = feed(d, (200, lambda t, i: 0.020 if t == NEVER else 0.060))  # twice, all alike
    assert set(seen) == {NEVER} and d.phase == "hold"
    seen = feed(d, (20, lambda t, i: 0.029 if t == NEVER else 0.060))  # near the others'
    assert any(t != NEVER for t in seen)  # a probe


def test_revisits_back_off_while_the_choice_stands():
    d = Decision("measure", 1024, revisit=20)
    seen = feed(d, (400, lambda t, i: 0.01 if t == 1024 else 0.02))
    assert set(seen[-100:]) <= {1024, 16384, NEVER} and d.switches == 0
    assert d.interval > 20  # doubled after each probe that kept the choice
    assert sum(t != 1024 for t in seen) < 0.1 * len(seen)


def test_steps_of_a_preconditioner_warm_up_are_not_counted():
    d = Decision("measure", 1024)
    for _ in range(12):
        d.observe(-1.0, [16384])  # a dense warm-up (Decision.end(typical=False)): not counted
    assert d.threshold == NEVER and d.medians == {}  # still the first candidate


def test_a_probe_waits_for_the_users_adams_warm_up_while_the_candidate_in_force_passes():
    """Where the compressing candidates would run dense for the user's Adam's warm-up (the
    engine's ``warming``, true for the first 10 steps here), the passing candidate in force
    holds: no compressing step before step 10, and then the same probe as a job without
    warm-up, its steps shifted, and the same choice."""
    def fed(wait):
        d, seen = Decision("measure", 1024), []
        for step in range(60):
            seen.append(d.threshold)
            d.observe(0.0 if step == 0 else {1024: 0.010, 16384: 0.014}.get(seen[-2], 0.030),
                      [16384, 2560, 10], warming=lambda: step < wait)
        return d, seen
    plain, plain_seen = fed(0)
    waited, waited_seen = fed(10)
    assert all(t == NEVER for t in waited_seen[:11]) and plain_seen[:11] != waited_seen[:11]
    start = plain_seen.index(1024)
    assert waited_seen.index(1024) > 10
    shift = waited_seen.index(1024) - start
    assert waited_seen[start + shift:] == plain_seen[start:len(plain_seen) - shift]
    assert waited.phase == plain.phase == "hold" and waited.threshold == plain.threshold == 1024
    asked = []
    d = Decision("measure", 1024)
    for step in range(30):  # asked only while a probe is to begin: not in the hold
        d.observe(0.0 if step == 0 else 0.030, [16384, 2560, 10],
                  warming=lambda: asked.append(step) or False)
    assert asked and max(asked) < 30 and d.phase == "hold"
    held_from = len(asked)
    for step in range(30, 60):
        d.observe(0.030, [16384, 2560, 10], warming=lambda: asked.append(step) or False)
    assert len(asked) == held_from


@pytest.mark.parametrize("every", [2, 16, 64])
def test_the_steps_granted_ahead_are_the_quiet_and_silent_ones_that_follow(every):
    """``QuietSteps.ahead`` (what a graph front end may end itself, ``hvdcomp.engine.QuietGrant``)
    counts exactly the steps after a quiet and silent one that ``take`` finds quiet and
    ``expects`` silent, up to the quiet step whose window the next agreed step reads."""
    from hvdcomp.engine import QuietSteps
    quiet = QuietSteps()
    quiet.size, quiet.every = 6, every
    for step in range(1, 3 * every):
        if not quiet.expects(step):  # the step before was not silent: nothing granted
            continue
        following = 0
        while quiet.take(6, step + following, True) and quiet.expects(step + following + 1):
            following += 1
        assert quiet.ahead(step) == following, (step, following)
    quiet.size = 0  # no quiet steps may follow (the last agreement found no whole pass)
    assert quiet.ahead(5) == 0


def test_while_the_probe_waits_for_adams_warm_up_the_quiet_steps_run_between_sparse_agreements():
    """``QuietSteps.agreed``: while the decision's probe waits for the user's Adam's warm-up
    (``Decision.waiting``) there is nothing to time, so the next agreement comes ``EVERY``
    steps on, not every other step as while the probe times its candidates (``PROBING``); once
    the warm-up has ended the probe's cadence is back, and the hold's after it."""
    from types import SimpleNamespace

    from hvdcomp.engine import QuietSteps
    agreement = SimpleNamespace(all_by_horovod=True)
    entries = [SimpleNamespace(numel=n) for n in (16384, 2560, 10)]
    d, quiet, every = Decision("measure", 1024), QuietSteps(), []
    for step in range(40):
        d.observe(0.0 if step == 0 else 0.001 if d.threshold == NEVER else 0.030,
                  [16384, 2560, 10], warming=lambda: step < 10)
        quiet.agreed(entries, agreement, "propagate", d, 4)
        every.append((d.waiting, d.phase, quiet.every))
    assert every[0] == (True, "probe", QuietSteps.EVERY)  # the first step: waiting already
    assert all(e == QuietSteps.EVERY for w, _, e in every if w) and every[9][0]
    assert every[10] == (False, "probe", QuietSteps.PROBING)  # the warm-up is over: it times
    assert every[-1][1] == "hold" and every[-1][2] >= QuietSteps.EVERY
    assert Decision("measure", 1024).waiting is False  # no warm-up asked about: no wait


def linked(link, times, steps=60, numels=(16384, 2560, 10), half=True, wait=0, drift_at=None):
    """A decision offered the float16 pass, the measured ``link`` given at its first step, fed
    ``times`` (candidate -> seconds per step, ``HALF`` for it; the method's, after step
    ``drift_at``, times 6); returns it and the candidates in force at each step."""
    d, seen = Decision("measure", 1024), []
    for step in range(steps):
        key = HALF if d.passes_half() else d.threshold
        seen.append(key)
        took = times[seen[-2]] if step else 0.0
        if drift_at is not None and step > drift_at and seen[-2] == 1024:
            took *= 6
        d.observe(took, numels, half=half, link=link and (lambda: link),
                  warming=lambda: step < wait)
    return d, seen


SLOW = Link(latency=0.001, seconds_per_byte=1e-6)  # 1 MB/s: passing 18954 floats >= 77 ms
FAST = Link(latency=1e-5, seconds_per_byte=1e-10)
LOADED = Link(latency=0.0, seconds_per_byte=1e-8)  # a slope, no latency: floors under 1 ms


def test_where_the_links_latency_rules_passing_the_float16_pass_is_no_candidate():
    """A thousand tensors of 16 elements on a link whose latency is most of their all-reduce:
    halving the bytes saves under a tenth of it, less than converting every tensor twice costs,
    so the float16 pass is not offered (a probe would time it, and noise could choose it); where
    the bytes rule the all-reduce it is offered."""
    latency_bound = Link(latency=0.001, seconds_per_byte=1e-9)  # 64 kB: 1.06 ms in float32
    assert decision.candidates([16] * 1000, 1024, half=True, link=latency_bound) == [1024, NEVER]
    assert decision.candidates([16384, 2560, 10], 1024, half=True, link=SLOW) == [
        1024, 16384, HALF, NEVER]
    d = Decision("measure", 1024)
    d.observe(0.0, [16] * 1000, half=True, link=lambda: latency_bound)
    assert d.thresholds == [1024, NEVER] and not d.passes_half()
    d = Decision("measure", 1024)
    d.observe(0.0, (16384, 2560, 10), half=True, link=lambda: SLOW)
    assert HALF in d.thresholds


def test_on_a_slow_link_the_method_runs_from_the_second_step_and_no_pass_step_at_all():
    """Passing every tensor cannot take less than 77 ms on the link, the method's step is
    estimated at 6 ms and measured at 10: the method is in force from the second step, the
    passing candidates (floors 39 and 77 ms) are never run, their floors stand for their
    medians, and the choice holds the method. The candidate that compresses the largest tensor
    only (floor 11 ms: not hopeless) takes its screen's steps."""
    d, seen = linked(SLOW, {1024: 0.010, 16384: 0.05, HALF: 0.05, NEVER: 0.09})
    assert seen[:4] == [NEVER, 1024, 1024, 1024] and set(seen[1:]) == {1024, 16384}, seen
    assert seen.count(16384) <= 3 and set(seen[-30:]) == {1024}
    assert d.phase == "hold" and d.threshold == 1024 and d.favours_method()
    assert d.floors[3] == pytest.approx(SLOW.seconds(4 * 18954))
    shown = d.as_dict()
    assert sorted(shown["not_run"]) == ["pass all", "pass all in fp16"]
    assert shown["medians"]["pass all"] == d.floors[3]
    twin = Decision("measure", 1024)
    twin.load(d.state())
    assert twin.state() == d.state() and twin.floors == d.floors


def test_a_candidate_whose_floor_is_not_hopeless_is_still_timed():
    """The floors only skip: a candidate whose floor is within ``1 + abort`` of the best sample
    runs and its measured median decides (here passing in float16, floor 38 ms, measured 30 ms
    less than the method's 45 ms: it wins)."""
    d, seen = linked(SLOW, {1024: 0.045, 16384: 0.09, HALF: 0.040, NEVER: 0.09})
    assert seen[1] == 1024 and HALF in seen and d.passes_half() and d.phase == "hold"
    assert "pass all in fp16" not in d.as_dict()["not_run"]


def test_on_a_fast_link_the_floors_change_nothing():
    """Where the floors are far below the steps, or below ``MIN_FLOOR`` (shared memory under
    load: passing's floor 0.8 ms, 3.8x the method's estimate, and 2x the steps of 0.4 ms), the
    decision runs as with no link: passing first, every candidate timed."""
    times = {1024: 0.010, 16384: 0.02, HALF: 0.02, NEVER: 0.02}
    without, plain = linked(None, times)  # no link: the first observation gets None
    fast = {1024: 0.0004, 16384: 0.0004, HALF: 0.0004, NEVER: 0.0004}
    for link, times in ((FAST, times), (LOADED, fast)):
        with_link, seen = linked(link, times)
        assert seen == linked(None, times)[1] and seen[:2] == [NEVER, NEVER], seen
        assert not with_link.favoured and with_link.as_dict()["not_run"] == []
    assert linked(FAST, {1024: 0.010, 16384: 0.02, HALF: 0.02, NEVER: 0.02})[0].threshold == 1024


def test_a_favoured_method_waits_for_the_warm_up_and_a_drift_runs_every_candidate():
    """Under the user's Adam's warm-up the passing candidate holds first (the method's tensors
    would run dense); then the method runs first. A drift's probe runs the skipped candidates
    (their floors are from the start), and a passing candidate that has become the fastest is
    chosen."""
    times = {1024: 0.010, 16384: 0.05, HALF: 0.05, NEVER: 0.09}
    d, seen = linked(SLOW, times, wait=10)
    assert set(seen[:11]) == {NEVER} and NEVER not in seen[11:] and HALF not in seen, seen
    assert seen[11:14] == [1024] * 3 and d.threshold == 1024
    d, seen = linked(SLOW, {1024: 0.010, 16384: 0.05, HALF: 0.045, NEVER: 0.09}, steps=120,
                     drift_at=40)
    assert NEVER not in seen[1:40] and HALF not in seen[:40] and HALF in seen[40:], seen
    assert d.phase == "hold" and d.passes_half()


def test_fixed_modes_and_the_state_round_trip():
    assert feed(Decision("compress", 1024), [0.1] * 20)[-1] == 1024
    assert feed(Decision("pass", 1024), [0.1] * 20)[-1] == NEVER
    d = Decision("measure", 1024)
    feed(d, (9, lambda t, i: 0.01))
    twin = Decision("measure", 1024)
    twin.load(d.state())
    rest = (30, lambda t, i: 0.01 if t == NEVER else 0.02)
    assert feed(twin, rest) == feed(d, rest) and twin.state() == d.state()
    other = Decision("compress", 1024)
    other.load(d.state())  # another mode's state: ignored
    assert other.threshold == 1024 and other.phase == "fixed"
    assert not math.isfinite(Decision("pass", 7).threshold)


METHODS = [("marsit", 0.05), ("topk", 0.05), ("efsignsgd", 0.02)]
RESUMED = [("marsit", 0.05), ("topk", 0.05), ("binsgdm", 0.1)]
# The cases of tests/mpi/decision.py here, in two launches (``conftest.decision_results``):
# those that measure, and those that compress (or set the decision by hand), 'unlike' last (it
# leaves a step raised on every rank).
MEASURED = ([(name, lr, "carry") for name, lr in METHODS] + [("marsit", 0.05, "half")]
            + [(name, lr, "resume") for name, lr in RESUMED] + [("marsit", 0.003, "adam-wait")])
COMPRESSED = [("marsit", 0.003, "adam-carry"), ("topk", 0.003, "adam-carry"),
              ("sgd", 0.1, "aside"), ("adamw", 0.003, "aside"), ("marsit", 0.003, "unlike")]


@pytest.mark.timeout(600)  # the first pays the launch of every case of MEASURED
@pytest.mark.parametrize("name,lr", METHODS)
def test_on_real_ranks_every_rank_decides_alike_and_a_switch_loses_no_memory(name, lr):
    res = decision_results(name, lr, "carry", MEASURED, MEASURE)
    assert sorted(res) == list(range(4))
    ours = res[0]
    assert ours["identical"] == ours["steps"]  # bit-identical parameters after every step
    assert all(r["thresholds"] == ours["thresholds"] for r in res.values())
    assert ours["phase"] == "hold"  # the probe finished within the run
    assert len(set(ours["thresholds"])) == 3  # every candidate ran
    assert any(ours["halves"])  # the float16 pass too (its threshold: inf, as passing's)
    runs = [r for r in ours["runs"] if r["memory"] > 0]
    assert runs, ours["runs"]  # some tensor with memory was passed after being compressed
    for r in runs:  # exact to float32's rounding, plus float16's over steps passed in it
        assert r["error"] <= 1e-4 * r["scale"] + 1e-6 + r["fp16_rounding"], r


def test_on_real_ranks_under_the_users_adamw_the_probe_compresses_only_after_its_warm_up():
    """Under the user's AdamW (its tensors dense for Adam's first 10 steps), the decision passes
    every tensor to Horovod until the warm-up ends, then probes: the same thresholds on every
    rank, a compressing one within the run, none before step 10; ranks bit-identical."""
    res = decision_results("marsit", 0.003, "adam-wait", MEASURED, MEASURE)
    assert sorted(res) == list(range(4))
    ours = res[0]
    assert ours["identical"] == ours["steps"] and ours["adam_steps"] == ours["steps"]
    assert all(r["thresholds"] == ours["thresholds"] for r in res.values())
    compressing = [i for i, t in enumerate(ours["thresholds"]) if t != "inf"]
    assert compressing and min(compressing) >= 10, ours["thresholds"]


def test_on_real_ranks_the_float16_candidate_is_horovods_own_fp16_and_switches_both_ways():
    """The decision's float16 candidate (``hvdcomp.decision.HALF``, offered where Horovod sums
    every passed tensor): its steps are bit-equal to Horovod's own fp16 average of the ranks'
    gradients and send half of the float32 bytes; a step passing in float32 after it is the
    exact mean again, and in the float16 one after a compressed step the tensors that carry
    memory go through hvdcomp's exact sum (fewer bytes left to Horovod). Ranks bit-identical.
    Not offered under ``on_nonfinite='raise'`` (a float16 sum may overflow)."""
    res = decision_results("marsit", 0.05, "half", MEASURED, MEASURE)
    assert sorted(res) == list(range(4))
    ours = res[0]
    assert "fp16" in ours["candidates"], ours["candidates"]
    assert "fp16" not in ours["strict_candidates"], ours  # on_nonfinite='raise': exact sums
    assert "inf" in ours["strict_candidates"], ours
    steps = ours["steps"]
    assert [s["candidate"] for s in steps] == ["fp16"] * 4 + ["inf", "1024", "fp16"]
    fp32_bytes = steps[4]["horovod_bytes"]
    assert fp32_bytes > 0
    for s in steps:
        assert s["identical"], s
        assert s["half"] == (s["candidate"] == "fp16"), s
    for s in steps[:4]:
        assert s["fp16_gap"] == 0.0, s  # Horovod's fp16 result, bit for bit
        assert 0.0 < s["exact_gap"] <= 2.0 ** -8, s  # rounded, as float16 rounds
        assert s["horovod_bytes"] * 2 == fp32_bytes, (s, fp32_bytes)
    assert steps[4]["exact_gap"] <= 1e-6, steps[4]  # float32 again: the exact mean
    assert steps[5]["horovod_bytes"] < fp32_bytes // 10, steps[5]  # compressed
    assert steps[6]["horovod_bytes"] < fp32_bytes, steps[6]  # the carried ones by hvdcomp


@pytest.mark.timeout(600)  # the first pays the launch of every case of COMPRESSED
def test_ranks_whose_uncompressed_sums_would_differ_in_size_all_raise_instead_of_hanging():
    """A per-rank state that should be alike and is not (here: rank 0 made to carry its memory
    into the gradient while the others send ``[g, e]``, as PowerSGD's node stages did before
    2026-11-28) gives the ranks' float rings other sizes; hvdcomp checks the sizes in the step's
    all-gather and every rank raises ``RankMismatchError`` naming them, nothing applied (the
    step number unchanged, parameters still bit-identical), where before some ranks failed in
    MPI and the others waited for ever."""
    res = decision_results("marsit", 0.003, "unlike", COMPRESSED, COMPRESS)
    assert sorted(res) == list(range(4))
    for r in res.values():
        assert r["raised"] and r["raised"].startswith("RankMismatchError"), r
        assert "different sizes on the ranks" in r["raised"], r
        assert r["step"] == res[0]["step"] == 14, r  # ADAM_COMPRESSED steps, the 15th dropped
        assert r["digest"] == res[0]["digest"]


@pytest.mark.parametrize("name", ["marsit", "topk"])
def test_under_adamw_a_passed_tensor_carries_its_memory_into_the_momentum_not_the_gradient(name):
    """Under the user's AdamW, a tensor passed after compressed steps (its memory kept of the
    momentum sent, ``hvdcomp.preconditioning.FollowAdam``) hands its memory to Adam's momentum:
    Adam's moments after that step are ``b1 m + (1 - b1) mean(g) + mean(e)`` and ``b2 v + (1 -
    b2) mean(g)**2``, the second moment not inflated by the memory (as ``e / (1 - b1)`` in the
    gradient would)."""
    res = decision_results(name, 0.003, "adam-carry", COMPRESSED, COMPRESS)
    assert sorted(res) == list(range(4))
    for r in res.values():
        assert r["identical"]
        carried = [t for t in r["tensors"].values() if t["memory"] > 0]
        assert carried, r["tensors"]  # the large tensors had memory to carry
        for n, t in r["tensors"].items():
            assert t["passed"]
            assert t["m_error"] <= 1e-5 * t["m_scale"] + 1e-9, (n, t)
            assert t["v_error"] <= 1e-5 * t["v_scale"] + 1e-12, (n, t)


@pytest.mark.parametrize("name,lr", RESUMED)
def test_a_resume_after_the_decision_switched_is_bit_identical(name, lr):
    res = decision_results(name, lr, "resume", MEASURED, MEASURE)
    ours = res[0]
    assert ours["saved_at"] is not None and ours["mode"] == "measure"
    assert ours["second"]["thresholds"][0] == ours["first"]["thresholds"][0]  # restored
    assert ours["second"] == ours["first"]
    assert all(r["second"] == ours["first"] for r in res.values())


@pytest.mark.timeout(400)
def test_tensorflow_tape_and_keras_decide_alike_on_every_rank():
    """The same decision through TensorFlow (DistributedGradientTape in a tf.function, Keras
    model.fit): the ranks stay bit-identical while it probes and holds, both candidates run
    (its two large kernels hold equal halves: no threshold between)."""
    res = results(run(2, "tf_train.py", "marsit", 6, env=MEASURE, timeout=360))
    assert sorted(res) == [0, 1]
    for r in res.values():
        assert r["tape_identical"] == r["tape_steps"] > 0
        assert r["keras_identical"] == r["keras_steps"] > 0
        for d in (r["tape_decision"], r["keras_decision"]):
            assert d["mode"] == "measure" and d["phase"] == "hold", d
            assert d["threshold"] in d["candidates"] and len(d["candidates"]) == 2, d  # no middle
    assert res[0]["tape_decision"] == res[1]["tape_decision"]
    assert res[0]["keras_decision"] == res[1]["keras_decision"]


@pytest.mark.timeout(200)
def test_where_every_tensor_is_passed_hvdcomp_agrees_at_doubling_intervals_only():
    """Quiet steps: with every tensor left to Horovod's own allreduce (decision='pass', NaN
    propagated), hvdcomp's agreement all-gather runs at steps 0, 16, 32, 64 only (16 steps,
    doubled at each agreement that finds the same batch; one collective per step after
    Horovod's cost about as much as Horovod's whole allreduce of a small model), and
    the training is bit-identical to Horovod's Compression.none; with on_nonfinite='skip'
    hvdcomp must see every step's statuses, so it agrees at every step."""
    res = results(run(2, "quiet_steps.py", timeout=150))
    assert sorted(res) == [0, 1]
    for r in res.values():
        assert all(r[name]["identical"] == 70 for name in ("none", "pass", "pass-skip"))
        assert r["pass"]["digest"] == r["none"]["digest"] == r["pass-skip"]["digest"]
        agreed = [step for step, sent in enumerate(r["pass"]["sent"]) if sent > 0]
        assert agreed == [0, 16, 32, 64], r["pass"]["sent"]
        assert all(sent > 0 for sent in r["pass-skip"]["sent"]), r["pass-skip"]["sent"]
    assert res[0]["pass"]["digest"] == res[1]["pass"]["digest"]


@pytest.mark.timeout(200)
def test_tensorflow_hands_passed_gradients_to_horovods_own_allreduce_in_the_traced_step():
    """TensorFlow (DistributedGradientTape in a tf.function): where the decision passes a
    gradient, the step's plan hands it to Horovod's allreduce itself (summed as the backward
    pass goes, as under Compression.none), not to hvdcomp's sum after it: Horovod's bytes are
    every gradient's, hvdcomp agrees at steps 0, 16, 32, 64 only, the sum Horovod makes last
    is handed over by an op of hvdcomp's, ending the decision's window, on the steps whose
    window the decision reads (an agreed step's and the one before it), the quiet steps run no
    step op of hvdcomp's, those that a quiet step grants ahead no Python of hvdcomp's (counted
    all the same, when read), and the training is bit-identical to Horovod's Compression.none;
    with on_nonfinite='skip' hvdcomp still checks
    every step and a NaN step returns zeros where Horovod summed NaN; under
    decision='compress' Horovod sums only the tensors under min_compress_numel."""
    res = results(run(2, "tf_pass.py", timeout=180))
    assert sorted(res) == [0, 1]
    every = 4 * (64 * 64 + 64 + 64 * 10 + 10)  # the MLP's gradients in float32, 2 ranks
    small = 4 * (64 + 64 * 10 + 10)  # those under 1024 elements
    for r in res.values():
        assert all(r[name]["identical"] == 70 for name in ("none", "pass", "pass-skip",
                                                           "compress"))
        assert r["pass"]["digest"] == r["none"]["digest"] == r["pass-skip"]["digest"]
        assert r["compress"]["digest"] != r["none"]["digest"]
        assert r["pass"]["summed"] == r["pass-skip"]["summed"] == [every] * 70
        assert r["compress"]["summed"] == [small] * 70
        # the sum of the last gradient Horovod may sum (the last layer's bias) is handed over
        # by its take op, which runs after every other Horovod sum of the step, so the
        # decision's window of a passed step ends after Horovod's sums (before 2026-12-02 the
        # op that marked a sum was removed by TensorFlow's graph optimiser: 0 per passed step;
        # until 2026-12-06 it was the first layer's kernel's, whose sum need not come last);
        # under 'pass' on the steps whose window is read only: the agreed steps and the quiet
        # step before each (before 2026-12-02: on every step); under 'compress' beside the
        # one compressed tensor's (the first layer's kernel)
        agreed = [step for step, sent in enumerate(r["pass"]["sent"]) if sent > 0]
        assert agreed == [0, 16, 32, 64], r["pass"]["sent"]
        read = [int(step in agreed or step + 1 in agreed) for step in range(70)]
        assert r["pass"]["handed"] == read, r["pass"]["handed"]
        assert r["pass-skip"]["handed"] == [1] * 70, r["pass-skip"]["handed"]
        assert r["compress"]["handed"] == [2] * 70, r["compress"]["handed"]
        # the step op reduces a batch on the agreed steps only (before 2026-12-02: every step)
        assert r["pass"]["reduced"] == [int(step in agreed) for step in range(70)]
        # the plan op's Python runs on the agreed steps and the quiet ones beside each: the
        # first quiet step grants the rest ahead (hvdcomp.engine.QuietGrant), and
        # the graph ends those itself; every step is counted all the same, read every step
        # ('pass') or only after the run ('pass-unread'), with the same figures
        beside = [int(step in agreed or step - 1 in agreed or step + 1 in agreed)
                  for step in range(70)]
        assert r["pass"]["planned"] == r["pass-unread"]["planned"] == beside, r["pass"]["planned"]
        assert r["pass"]["step"] == r["pass-unread"]["step"] == 70
        figures = ("steps", "step", "elements", "bytes_sent", "bytes_recv", "horovod_bytes",
                   "decision")
        assert ({f: r["pass"]["total"][f] for f in figures}
                == {f: r["pass-unread"]["total"][f] for f in figures}), r["pass-unread"]["total"]
        assert r["pass"]["total"]["steps"] == 70
        assert r["pass-unread"]["digest"] == r["pass"]["digest"]
        for name in ("pass-skip", "compress"):
            assert r[name]["planned"] == [1] * 70, (name, r[name]["planned"])
            assert r[name]["reduced"] == [1] * 70, (name, r[name]["reduced"])
        assert all(sent > 0 for sent in r["pass-skip"]["sent"] + r["compress"]["sent"])
        nan, zero, same = r["nan"]["at_poison"]
        assert all(nan) and not any(zero) and same, r["nan"]["at_poison"]  # Horovod's NaN
        nan, zero, same = r["nan-skip"]["at_poison"]
        assert all(zero) and not any(nan) and same, r["nan-skip"]["at_poison"]
        assert r["nan-skip"]["identical"] == 6
    assert res[0]["pass"]["digest"] == res[1]["pass"]["digest"]


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.1), ("adamw", 0.003)])
def test_binsgdm_steps_aside_with_the_expected_step_and_its_own_moments_across_switches(
        optimizer, lr):
    """BinSGDM, whose result is the step itself, passes by stepping aside (hvdcomp.stepaside):
    a passed step is the mean over ranks of each rank's ``clip(m / v)`` (times the ranks' mean
    ``mean(v)`` under SGD; under AdamW, the first moment Adam is left with, times the factor of
    the ranks' mean normalised gradient and clipped to [-1, 1]: ``BinSGDM.adam_step``), Horovod's
    own allreduce carrying it (under AdamW too: its moments set as the step is handed back); the
    moments are each rank's own, of its own gradients,
    through voted steps and back; a NaN on one rank leaves them unchanged on every rank; a
    parameter that gets no gradient (Horovod's zero fill) gets a zero step and no state; the
    parameters stay bit-identical."""
    res = decision_results(optimizer, lr, "aside", COMPRESSED, COMPRESS)
    assert sorted(res) == list(range(4))
    for r in res.values():
        for row in r["steps"]:
            assert row["identical"], row
            assert row["moment_gap"] <= 1e-5, row  # float32 against the float64 twin
            assert row["unused_state"] == [], row  # absent: no state, as the engine does
            if optimizer == "sgd":
                assert row["unused_moved"] == 0.0, row  # and a zero step
            if row["step"] == 3:  # ASIDE_NAN
                assert row["all_nan"], row
                continue
            voted = row["step"] in (5, 6, 7)  # ASIDE_COMPRESSED
            assert (row["voted"] > 0) == voted, row
            if not voted and "step_gap" in row:
                assert row["step_gap"] <= 1e-5, row
            if not voted:  # the message went by Horovod (under AdamW too)
                assert row["horovod_bytes"] > 0, row
        assert sum("step_gap" in row for row in r["steps"]) >= 7
