"""The compress-or-pass decision: which tensors a step compresses, chosen by measured step time.

Compressing saves wire time and costs codec time, and hvdcomp's compressed reduction runs after
the backward pass where Horovod's own allreduce of an uncompressed gradient overlaps it. So where
the wire is fast, or hidden behind the backward pass, sending gradients as they are is faster, and
exact; where the wire dominates, compressing wins. Which regime a job is in depends on the model,
the cluster and the load, so hvdcomp measures it instead of modelling it.

What is decided: a size threshold. A tensor of at least ``threshold`` elements is compressed;
a smaller one is *passed*: summed exactly (its dtype, float32 or float64) by Horovod's own
allreduce where ``compress()`` can hand it over (``hvdcomp.facade.horovod_sums``: torch
optimizers, one batch per step; TensorFlow's float32 gradients through the step's plan,
``hvdcomp.facade.frontends.tensorflow.StepBatch``), else by one MPI all-reduce in the step
(``hvdcomp.engine``).
Candidates: every tensor the method would compress (``min_compress_numel``), only the largest
tensors that hold half of the step's elements, none (every gradient passed), and, where Horovod
sums every passed gradient itself, the front end can hand it over in float16 (torch: the
adapter's ``halved``; a TensorFlow graph fixes the dtype Horovod sums when it is traced) and
NaN/Inf is propagated (the default ``on_nonfinite``), none with every gradient passed in float16 (``HALF``: Horovod's own ``Compression.fp16``, so that a
job where fp16's traffic beats both the method and the exact sum runs as fast as Horovod's fp16
would; a float32 gradient, no loss scale in force, ``hvdcomp.facade.runtime.Runtime.sent``).
Like Horovod's fp16 it rounds each gradient and the sum to float16: elements under about 6e-8
in magnitude become 0, and a sum beyond float16's range, +-65504, overflows to Inf, which
'propagate' hands on as it does a rank's own Inf (so it is not offered under 'raise' or 'skip',
which promise to catch every non-finite step).

What is measured: each step's *exchange window*, from its first gradient handed to ``compress()``
(in the backward pass; for a graph front end, its step's plan, ``horovod_plan``, which runs
before the gradients reach Horovod, or where it has none, the start of the step's reduction) to
its last result handed back by ``decompress()`` (after Horovod's wait for its own allreduces; for
a graph front end, its last per-gradient op that hands a result back,
``BatchedCompressor.handed_over``: every compressed result's, and one that waits for every
gradient Horovod sums, ``hvdcomp.facade.frontends.tensorflow.StepBatch.hands_over``), taken on
every rank and agreed as the slowest rank's (it rides the next step's agreement all-gather,
``hvdcomp.checks.agree``). Everything a candidate changes is in it: the
rest of the backward pass and the overlap of Horovod's allreduce with it, the wait for that
allreduce, hvdcomp's encode / comm / decode; what no candidate changes is not (the forward pass,
the optimizer, the data loader, the user's evaluations and checkpoints between steps; a
TensorFlow plan that runs before the forward pass adds its time to every candidate alike), so a pause
of the training loop is not taken for a slow candidate. Each candidate
is timed as it runs once chosen: passing every tensor on quiet steps (no collective of hvdcomp's,
``hvdcomp.engine.QuietSteps``) where they apply; a step that is not typical of its candidate (a
preconditioner's dense warm-up, the first passed step of a tensor carrying its error memory) is
not counted.

What is predicted, before anything is timed (mode 'measure', the job's first gradient,
``hvdcomp.comm.link``): how fast the network sums a buffer (all-reduces of growing size up to 4
MiB, 0.1-0.3 s once), hence a *floor* under each candidate's step: the bytes it passes cannot
cross the link faster, whatever overlaps them. The floors only save steps, they never choose:
where passing every tensor's floor is ``FIRST`` (2) times an estimate of the method's step (its
wire at a quarter of a byte per element, its codec at 10 ns per element), the method is put in
force from the second step on (the first passes: nothing is known before it), before passing,
and its kernels load at once; a probe skips a candidate whose floor is over ``1 + abort`` times
the best sample so far (it would be dropped after its sample anyway), its floor standing for its
median, until a drift starts a probe that runs every candidate. So on a slow link the job
compresses from its second step and never runs a passing step to learn that it is slow (20
Mbit/s, ResNet-18: each would take 20-30 s); floors under ``MIN_FLOOR`` (20 ms) do neither, so
where the floors are low nothing changes.

How (``Decision.observe``, once per step, the same numbers on every rank, so every rank holds the
same threshold, applied from the next step on):

- *probe*, in two rounds, begun once no tensor the method compresses would run dense for a
  preconditioner's warm-up (the user's Adam's first 10 steps,
  ``hvdcomp.preconditioning.FollowAdam``: a compressing candidate's steps would not be typical
  of it, and each would be slower than the candidate in force, which holds until then). The
  screen: each candidate runs ``settle`` steps (not counted; none
  where the candidate is the one already in force: the window observed at a step is the previous
  step's, which ran the previous candidate, and a candidate's first step is not typical of it:
  Horovod negotiates anew every tensor whose shape or dtype changed, the gradient in place of
  hvdcomp's placeholder or in float16, measured 0.5-1.5 s more than its next steps on ResNet-18
  at 300 Mbit/s, which a single sample could take for the candidate's speed) and one sample;
  the one in force first (at the start of training: passing every tensor, or the method where
  it is favoured), then the others, most compression first, less those whose floor is
  hopeless. The finalists, those whose sample
  is within ``1 + abort`` times the best one, then take ``samples - 1`` more each (the one in
  force first, without settling); the others are dropped. So a hopeless candidate costs two
  steps whichever side of the winner it lies (in one round of a fixed order, only those after a
  faster one could be dropped: where passing wins, the compressing candidates, which come first,
  would run every sample at their slow speed). The choice is the fastest median;
  a candidate that compresses more must beat one that compresses less by ``margin`` (a tie goes
  to the exact sum: equal time, better gradients). Where a finalist's median is closer to the
  choice's than half the range of either one's samples (noise may have decided: a loaded
  machine, the first steps after a switch), the two (or more) take ``samples`` more each, up to
  ``retakes`` times, and the choice is made again on all of their samples; such candidates are
  close, so the extra samples cost little.
- *hold*: the chosen candidate's last ``2 samples`` windows are watched; their median rising
  above ``1 + band`` times the median it was chosen at, where ``band`` is the larger of
  ``drift`` and twice the spread its probe saw ((max - min) / median: the noise), to within
  ``margin`` of what the fastest other candidate was measured at (a rise that leaves the choice
  clearly faster than every other was cannot change it: a slower wire or busier cores slow the
  others too), or ``revisit`` steps passing (doubled each time the choice stands, up to 16
  times), starts a new probe, the chosen candidate first (it stays unless another wins by
  ``margin``). Noise within the band changes nothing, so the choice does not flap. A median
  below ``1 - band`` times it becomes the new reference without a probe, the others' medians
  scaled alike: the choice got faster (its probe's steps came right after another candidate's,
  or were among the first: Horovod negotiates a tensor's first allreduces), which makes no
  other candidate better; a later rise is then measured from there.
- *light and full revisits*: a candidate whose median was within ``1 + abort`` times the
  choice's is *close* (noise may have decided between them, and probing it costs little); the
  others are *far*. The regular revisits run the choice and the close candidates only (a light
  probe; the far ones keep their medians). A full probe, every candidate, comes on a drift, or
  when it costs at most ``budget`` of the time the exchange takes: where the far candidates of
  the last full probe cost E seconds more than the choice would have, no sooner than
  E / (budget x the choice's median) steps after it (and after the regular interval; up to
  16 x ``revisit``). A light probe whose choice is no faster than a far candidate was (by
  ``margin``) is followed by a full one. So where passing wins by far (a fast wire: compressing
  steps cost several times a passed one) and float16 passing is close to it, a 660-step run
  probes the compressing candidates once.

Modes: ``'measure'`` (the default), ``'compress'`` (always the first candidate: what the method
compresses; for benchmarks and tests), ``'pass'`` (always the last). Where the result is the
optimizer's step itself, an exact sum of the input is not what the optimizer expects: BinSGDM
then steps aside instead (``hvdcomp.stepaside``: each rank sends the direction its votes draw
from), and ``precondition='adam'`` always compresses. A tensor that switches to passed loses
nothing: the error-feedback memory it holds is added to what it sends in its first passed step
(``hvdcomp.feedback.carry``). The state (``state()``/``load()``) is in the compressor's
checkpoints, so a resume holds the same threshold.
"""
import copy
import logging
import math
import os
import time

import numpy as np

log = logging.getLogger("hvdcomp.decision")
MODES = ("measure", "compress", "pass")
# The decision mode of compressors built without ``decision=``.
DEFAULT_MODE = os.environ.get("HVDCOMP_DECISION", "measure")
NEVER = math.inf  # the threshold that compresses nothing
HALF = "fp16"  # the candidate that compresses nothing and passes every tensor in float16


def candidates(numels, min_numel, half=False, link=None):
    """The thresholds to try, most compression first: ``min_numel`` (every tensor the method
    compresses), the size above which the largest tensors hold half of the elements of those
    (when that differs), ``HALF`` (with ``half``: Horovod sums every passed tensor; on a
    measured ``link``, only where ``halving_pays``) and ``NEVER``. ``numels``: the sizes of the
    step's tensors."""
    big = sorted((n for n in numels if n >= min_numel), reverse=True)
    found = [min_numel]
    if big:
        cut = np.searchsorted(np.cumsum(big), sum(big) / 2)
        middle = big[min(int(cut), len(big) - 1)]
        if middle > min_numel and middle > big[-1]:
            found.append(middle)
    half = half and (link is None or halving_pays(link, sum(numels)))
    return found + ([HALF] if half else []) + [NEVER]


# The float16 pass is a candidate only where halving the bytes saves at least this share of
# passing's all-reduce: where the link's latency rules it (many small tensors, a fast link), the
# two conversions per tensor cost more than the wire saves.
HALF_SAVES = 0.1


def halving_pays(link, total):
    """Whether passing ``total`` elements in float16 rather than float32 saves at least
    ``HALF_SAVES`` of their all-reduce on ``link`` (``hvdcomp.comm.link.Link``)."""
    full = link.seconds(4 * total)
    return full - link.seconds(2 * total) >= HALF_SAVES * full


# The method's step, estimated before it runs (to choose what runs first only): its wire at a
# quarter of a byte per element (1-bit signs both ways, or a sparse or low-rank message), plus
# its encode and decode at CODEC_SECONDS per element.
WIRE_BYTES, CODEC_SECONDS = 0.25, 1e-8
FIRST = 2.0  # the method runs first where passing's floor is this many times its estimate
# Floors under this (seconds) neither favour the method nor skip a candidate: next to a step's
# own Python they are noise (on one machine's shared memory they flip with the load).
MIN_FLOOR = 0.02


def predict(link, thresholds, numels):
    """``(floors, estimate)`` on the measured ``link`` (``hvdcomp.comm.link.Link``): each
    candidate's floor (index -> seconds: the all-reduce of what it passes, float32, float16 for
    ``HALF``) and an estimate of the method's step (``WIRE_BYTES``, ``CODEC_SECONDS``)."""
    total = sum(numels)
    floors = {i: link.seconds(2 * total if t == HALF else 4 * sum(n for n in numels if n < t))
              for i, t in enumerate(thresholds)}
    return floors, link.seconds(WIRE_BYTES * total) + CODEC_SECONDS * total


class ExchangeWindow:
    """This rank's exchange window of a step (see the module docstring): ``begin()`` at its
    first gradient, ``mark()`` at each result handed back, ``step_done(typical)`` at the end
    of its reduction; ``last_window``: the last step's seconds (0.0 before the first, -1.0
    where it was not typical of its candidate)."""
    last_window = 0.0
    _start = _done = _end = None  # this step's start; the last step's (start, typical); its end

    def begin(self):
        """A step's exchange starts now, unless it has started already; the last step's window
        is then complete (``last_window``)."""
        if self._start is not None:
            return
        self._start = time.perf_counter()
        if self._done is not None and self._end is not None:
            start, typical = self._done
            self.last_window = self._end - start if typical else -1.0

    def mark(self):
        """A result of the step was handed over: its window ends here unless another follows."""
        self._end = time.perf_counter()

    def step_done(self, typical=True):
        """The step's reduction ended (results may still be handed over: ``mark``); ``typical``:
        False where it did not run as its candidate says (a preconditioner's dense warm-up, an
        aborted step)."""
        self._done, self._start = (self._start, typical), None
        self.mark()


class DecisionRecord:
    """What a ``Decision`` shows and saves: its one-line description, its figures in the step
    stats, the line logged at a choice, its checkpoint state."""

    def describe(self):
        """One line: the mode, phase and what is compressed."""
        t = self.threshold
        what = ("every tensor passed in float16" if self.passes_half() else
                "every tensor passed" if t == NEVER else "every tensor it compresses"
                if t == self.min_numel else f"tensors of {t:,} elements or more compressed")
        chosen = (f" (chosen at {1e3 * self.medians[self.chosen]:.1f} ms/step)"
                  if self.phase == "hold" else "")
        return f"{self.mode}, {self.phase}: {what}{chosen}"

    def as_dict(self):
        """What ``last_stats`` shows of the decision; ``medians``: each candidate's median
        exchange window (seconds, the slowest rank's) in the last probe that timed it, or its
        floor where that probe did not run it (``not_run``); ``floors``: the least each
        candidate's step can take on the measured link (mode 'measure'; empty before)."""
        return {"mode": self.mode, "phase": self.phase, "threshold": self.threshold,
                "half": self.passes_half(), "candidates": self.thresholds,
                "switches": self.switches,
                "medians": {_name(self.thresholds[i]): m for i, m in sorted(self.medians.items())},
                "floors": {_name(self.thresholds[i]): m for i, m in sorted(self.floors.items())},
                "not_run": [_name(self.thresholds[i]) for i in self.unrun]}

    STATE = ("thresholds", "current", "phase", "medians", "spreads", "windows", "seen",
             "chosen", "interval", "switches", "taken", "queue", "round", "steps", "full_due",
             "light", "extra", "floors", "favoured", "first", "skipping", "unrun")

    def state(self):
        """Plain values for a checkpoint."""
        return {"mode": self.mode, **{k: copy.deepcopy(getattr(self, k)) for k in self.STATE}}

    def load(self, saved):
        """Restore ``state()`` (None, from a checkpoint written before the decision, or one of
        another mode: this one's beginning)."""
        if saved is None or saved.get("mode") != self.mode:
            return
        for name in self.STATE:
            if name in saved:
                setattr(self, name, copy.deepcopy(saved[name]))
        if "round" not in saved and self.phase == "probe":
            self.queue = None  # saved mid-probe by a version without rounds: probe again
        if "full_due" not in saved:  # saved before light probes: the next revisit is full
            self.full_due = self.interval - self.seen

    def log_choice(self):
        """Log the choice and every candidate's median (or floor, where it did not run)."""
        log.info("compress-or-pass: %s (median step per candidate: %s)", self.describe(),
                 ", ".join(f"{_name(self.thresholds[i])} "
                           + (f">= {1e3 * m:.1f} ms (not run: its floor)" if i in self.unrun
                              else f"{1e3 * m:.1f} ms")
                           for i, m in sorted(self.medians.items())))


class Floors:
    """What a ``Decision`` knows before it measures: the link (``hvdcomp.comm.link``, measured
    once, ``wants_link``), each candidate's floor from it (``predict``), and what they settle:
    the method put in force first where it is favoured by far (``_put_first``,
    ``favours_method``), and probe candidates skipped whose floor is hopeless
    (``_skip_hopeless``)."""

    link = None  # the measured ``hvdcomp.comm.link.Link`` the floors come from, or None

    def wants_link(self):
        """Whether the link is still to be measured: mode 'measure', before its first step."""
        return self.phase == "probe" and self.link is None and self.thresholds is None

    def _predict(self, link, numels, speak):
        """The floors from the measured ``link`` (``predict``); the method first if favoured."""
        self.floors, estimate = predict(link, self.thresholds, numels)
        pass_all = self.floors[len(self.thresholds) - 1]
        if pass_all > FIRST * estimate and pass_all >= MIN_FLOOR:
            self.first, self.favoured = 0, True
        if speak:
            log.info("compress-or-pass: the link sums %s; passing every tensor takes at least "
                     "%.1f ms a step, the method about %.1f ms: %s first", link.describe(),
                     1e3 * pass_all, 1e3 * estimate, "the method" if self.favoured else "passing")

    def _put_first(self):
        """Put the favoured candidate in force (it settles) unless a warm-up holds it back."""
        if self.first is None or self.waiting:
            return False
        self.current, self.first, self.seen = self.first, None, 0
        return True

    def _skip_hopeless(self):
        """Drop from the queue's head the candidates whose floor is over ``1 + abort`` times the
        best sample so far (and ``MIN_FLOOR``): they would be dropped after their sample anyway."""
        best = min((w[0] for w in self.taken.values()), default=math.inf)
        while (self.skipping and self.queue and self.queue[0] not in self.taken
               and self.floors.get(self.queue[0], 0.0) > max((1 + self.abort) * best,
                                                              MIN_FLOOR)):
            self.unrun.append(self.queue.pop(0))

    def favours_method(self):
        """Whether the method runs first, predicted to win by far (``FIRST``), and is in force
        (or about to be): its kernels are worth loading at once."""
        return self.favoured and 0 in (self.first, self.current)


class Decision(Floors, ExchangeWindow, DecisionRecord):
    """One compressor's threshold (see the module docstring). ``compresses(numel)`` is what the
    step engine and ``compress()`` ask; ``observe(window, numels)`` takes the agreed exchange
    window of the last step (``ExchangeWindow``: this rank's)."""

    def __init__(self, mode, min_numel, samples=3, settle=2, abort=0.5, margin=0.05,
                 drift=0.25, revisit=200, budget=0.01, retakes=2):
        self.mode, self.min_numel = mode, min_numel
        self.samples, self.settle, self.abort, self.margin = samples, settle, abort, margin
        self.drift, self.revisit, self.budget, self.retakes = drift, revisit, budget, retakes
        self.thresholds = None  # the candidates, fixed at the first step with sizes
        # index into thresholds (-1: NEVER); a probe starts passing (the cheapest candidate to
        # time: quiet steps; the first steps negotiate Horovod's allreduces anyway)
        self.current = 0 if mode == "compress" else -1
        self.phase = "probe" if mode == "measure" else "fixed"
        self.medians, self.spreads = {}, {}  # candidate -> median, (max-min)/median, last probe
        self.windows = []  # hold: the chosen candidate's last windows, watched
        self.seen = 0  # steps of the current candidate (probe) or since the choice (hold)
        self.taken = {}  # probe: candidate -> its samples so far
        self.queue = None  # probe: the candidates still to run in this round (None: not begun)
        self.round = "screen"  # probe: 'screen' (one sample each) or 'refine' (the finalists)
        self.chosen = None  # the candidate the last probe chose
        self.interval, self.switches = revisit, 0  # steps until a revisit; choices changed
        self.steps, self.full_due = 0, 0  # steps observed; the step count of the next full probe
        self.light = False  # whether the probe under way runs the close candidates only
        self.extra = 0  # rounds of ``samples`` more taken by the finalists within noise
        self.floors = {}  # candidate -> the least its step can take (seconds), from the link
        self.favoured = False  # the method is predicted to win by far (``FIRST``)
        self.first = None  # the candidate to put in force first where one is favoured (the
        # method), once no warm-up holds the probe back
        self.skipping = True  # a probe skips candidates whose floor is hopeless (not after a
        # drift: the floors were measured at the start)
        self.unrun = []  # the candidates the last full probe skipped

    @property
    def threshold(self):
        if self.thresholds is None:
            return self.min_numel if self.current == 0 else NEVER
        found = self.thresholds[self.current]
        return NEVER if found == HALF else found

    def passes_half(self):
        """Whether every tensor is passed in float16 this step (the ``HALF`` candidate)."""
        return self.thresholds is not None and self.thresholds[self.current] == HALF

    def compresses(self, numel):
        """Whether a tensor of ``numel`` elements is compressed this step."""
        return numel >= self.threshold

    waiting = False  # a probe is due but waits for a preconditioner's warm-up (``observe``)

    def observe(self, window, numels, speak=False, steps=1, half=False, warming=None,
                link=None):
        """Take the previous step's agreed exchange ``window`` (the slowest rank's, in
        seconds; 0: none yet; < 0: not typical, not counted, and the next one settles again);
        ``numels``: the sizes of this step's tensors (used once, to fix the candidates);
        ``speak``: log a new choice (rank 0); ``steps``: the steps since the last observation
        (more than 1 after quiet steps, ``hvdcomp.engine.QuietSteps``, which ran the candidate in
        force: they count toward ``revisit`` and ``settle``); ``half``: Horovod summed every
        tensor of the step on every rank (``HALF`` is then a candidate; used once, as
        ``numels``); ``warming``: None or a callable, true while a probe is to wait (*probe*;
        it sets ``waiting``, which ``hvdcomp.engine.QuietSteps`` reads); ``link``: None or a
        callable returning the measured ``hvdcomp.comm.link.Link`` (collective: called at the
        first observation of mode 'measure' on every rank, unless ``link`` was measured
        before: ``wants_link``). The new threshold applies from the next step."""
        if self.thresholds is None:
            if link is not None and self.wants_link():
                self.link = link()
            self.thresholds = candidates(numels, self.min_numel, half, self.link)
            if self.link is not None:
                self._predict(self.link, numels, speak)
        if self.phase == "fixed":
            return
        self.waiting = bool(self.phase == "probe" and self.queue is None and warming
                            and warming())
        if window == 0:
            self._put_first()
            return
        if window < 0:
            if self.phase == "probe":
                self.seen = 0
            return
        self.seen += steps  # quiet steps ran the candidate in force: they settle it too
        self.steps += steps
        if self._put_first():
            return
        if self.phase == "hold":
            self._hold(window, speak)
        elif self.seen > self.settle and not self.waiting:
            self._probe(window, speak)

    def _begin_probe(self, light=False):
        """A probe's screen round: the candidate in force first (it needs no settling), then
        the others, most compression first; a ``light`` one only those the last probe found
        close to the choice (``_close``), the others' medians kept."""
        others = [i for i in (self._close() if light else range(len(self.thresholds)))
                  if i != self._index()]
        self.queue, self.round, self.light = [self._index()] + others, "screen", light
        self.taken = {}
        if not light:
            self.medians, self.spreads, self.unrun = {}, {}, []
        self.seen = self.settle  # the first window observed is the candidate in force's

    def _close(self):
        """The candidates other than the choice whose median is within ``1 + abort`` of its."""
        return [i for i, m in self.medians.items()
                if i != self.chosen and m <= (1 + self.abort) * self.medians[self.chosen]]

    def _index(self):
        return self.current % len(self.thresholds)

    def _probe(self, window, speak):
        if self.queue is None:
            self._begin_probe()
        self.taken.setdefault(self._index(), []).append(window)
        wanted = 1 if self.round == "screen" else self.samples * (1 + self.extra)
        if len(self.taken[self._index()]) < wanted:
            return
        self.queue.pop(0)
        if self.round == "screen":
            self._skip_hopeless()
        if not self.queue and self.round == "screen":  # the finalists, the one in force first
            best = min(w[0] for w in self.taken.values())
            finalists = [i for i, w in self.taken.items()
                         if w[0] <= (1 + self.abort) * best and len(w) < self.samples]
            self.queue = sorted(finalists, key=lambda i: i != self._index())
            self.round = "refine"
        if self.queue:
            self._run_next()
            return
        for i, w in self.taken.items():
            self.medians[i] = float(np.median(w))
            self.spreads[i] = (max(w) - min(w)) / self.medians[i]
        for i in self.unrun:  # never run: its floor stands for it
            self.medians[i], self.spreads[i] = self.floors[i], 0.0
        self.queue, self.windows, self.seen = None, [], 0
        chosen = max(self.taken)  # the least compression first: ties pass
        for i in sorted(self.taken, reverse=True):
            if self.medians[i] < self.medians[chosen] * (1 - self.margin):
                chosen = i
        rivals = within_noise(self.taken, self.medians, chosen, self.samples)
        if rivals and self.extra < self.retakes:  # noise may have decided: more samples
            self.extra += 1
            self.queue = sorted([chosen, *rivals], key=lambda i: i != self._index())
            self._run_next()
            return
        self.extra = 0
        stands = chosen == self.chosen
        regular = 2 * self.interval if stands else self.revisit
        self.switches += not stands and self.chosen is not None
        self.chosen = self.current = chosen
        self.phase = "hold"
        if self.light:  # the far candidates' medians are the last full probe's
            stale = [m for i, m in self.medians.items() if i not in self.taken]
            if stale and self.medians[chosen] >= (1 - self.margin) * min(stale):
                self.full_due = self.steps  # one of those may now be faster: a full probe
        else:
            self.full_due = self.steps + min(max(regular, self._affordable(chosen)),
                                             16 * self.revisit)
        self.interval = regular if self._close() else self.full_due - self.steps
        if speak:
            self.log_choice()

    def _run_next(self):
        """Put the queue's first candidate in force; it settles unless it is in force."""
        self.seen = self.settle if self.queue[0] == self._index() else 0
        self.current = self.queue[0]

    def _affordable(self, chosen):
        """The steps after which a full probe like the last one costs ``budget`` of the
        exchange: each far candidate (a median over ``1 + abort`` times the choice's) ran its
        samples and ``settle`` steps at its mean. The close ones are probed at the regular
        revisits (light probes: noise may have decided between them, and they cost little)."""
        close = self._close() + [chosen]
        extra = sum((float(np.mean(w)) - self.medians[chosen]) * (len(w) + self.settle)
                    for i, w in self.taken.items() if i not in close)
        return math.ceil(max(extra, 0.0) / (self.budget * self.medians[chosen]) - 1e-6)

    def _hold(self, window, speak):
        self.windows = (self.windows + [window])[-2 * self.samples:]
        band = max(self.drift, 2 * self.spreads[self.chosen])
        ratio = (float(np.median(self.windows)) / self.medians[self.chosen]
                 if len(self.windows) == 2 * self.samples else 1.0)
        if ratio < 1 - band:  # faster than chosen at: the reference, not a reason to probe
            for i in self.medians:  # the others' too: what sped it up was likely common
                self.medians[i] *= ratio
        rival = min((m for i, m in self.medians.items() if i != self.chosen), default=math.inf)
        now = ratio * self.medians[self.chosen]
        drifted = ratio > 1 + band and now >= (1 - self.margin) * rival
        full = drifted or self.steps >= self.full_due
        if full or self.seen >= self.interval:
            if speak:
                log.info("compress-or-pass: probing again (%s%s)", "the step time drifted"
                         if drifted else f"{self.seen} steps since the choice",
                         "" if full else "; the close candidates only")
            # The chosen candidate, in force, is probed first; it stays unless another wins.
            self.phase = "probe"
            self.skipping = not drifted
            self._begin_probe(light=not full)

    def passes_all(self):
        """Whether every tensor is passed, and stays so until the next observation (in a probe
        too: the passing candidate is then timed on quiet steps, as it runs when chosen)."""
        return self.threshold == NEVER


def within_noise(taken, medians, chosen, samples):
    """Of the finalists ``taken`` (candidate -> its samples, ``medians`` theirs), those other
    than ``chosen`` with ``samples`` or more whose median is closer to ``chosen``'s than half
    the range (max - min) of either one's samples: noise may have decided between them."""
    def half_range(i):
        return (max(taken[i]) - min(taken[i])) / 2
    return [i for i, w in taken.items() if i != chosen and len(w) >= samples
            and abs(medians[i] - medians[chosen]) < max(half_range(i), half_range(chosen))]


def compresses_for_good(decision):
    """Whether the threshold in force of ``decision`` compresses some tensor as more than a
    first-round sample: a fixed mode's, the choice held, or a finalist of a probe's second round
    (where its samples may decide the choice). The step engine then loads the fused kernels
    (``hvdcomp.engine.KernelLoading``)."""
    return not decision.passes_all() and (decision.phase != "probe" or decision.round == "refine")


def _name(threshold):
    if threshold == HALF:
        return "pass all in fp16"
    return "pass all" if threshold == NEVER else f"compress from {threshold:,}"
