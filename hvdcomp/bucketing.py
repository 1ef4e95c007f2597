"""The step driver: how a compressor's step is cut into batches for its step engine (``fusion=``),
one driver for every mode, through the engine's public API (``process``, ``end_step``,
``skip_step``, ``abort_step``, ``context``) only. The facade hands it every gradient
(``arrived``) and ends the step with it (``finish_step``); graph front ends hand it a whole step
at once (``whole_step``).

Modes: 'step' = one batch per step (the default): the plan is the one bucket of every tensor,
reduced at the step's first ``decompress()`` by the engine's whole-step path (its quiet steps
included), no thread, no timing; 'auto' = LayerFusion; 'layerwise' = one bucket per tensor, for
benchmarks. LayerFusion:

- ``arrived(entry)`` is called by ``compress()`` (under the compressor's lock) with every
  gradient, in backward order. It timestamps the arrival (per-layer backward time for free) and,
  once a plan exists, marks the entry's bucket; a complete bucket wakes the worker.
- One background thread per runtime (a compressor's, per process set: ``hvdcomp.facade.runtime``)
  processes the plan's buckets strictly in plan order,
  each as soon as all of its gradients have been compressed, through the compressor's usual
  checked batch path (``engine.process(..., end_step=False)``), so every rank runs the same
  collectives in the same order (only this thread issues hvdcomp collectives during a step).
- ``finish_step()`` runs at the step's first ``decompress()``: it closes the step, waits for the
  worker, reduces the rest (tensors outside the plan, and buckets that did not complete) as one
  final batch sorted by name, then ends the step (``engine.end_step``: one step counted, one
  ``last_stats``, the state committed). Whole-step semantics: every bucket only stages its new
  state in the state store (``hvdcomp.state``); if any bucket meets NaN/Inf, an unsupported dtype
  or a rank mismatch (all detected collectively, so on every rank at the same bucket), the step
  is aborted (``engine.abort_step``: the staged state dropped) and the error raised on every rank
  from ``decompress()``; with ``on_nonfinite`` 'propagate' or 'skip' the whole step is skipped instead
  (``engine.skip_step``). An
  exception in the worker is re-raised in the main thread; the worker never outlives its step.
- Planning (collective, at the end of a step, same point on every rank): every rank's arrival
  times and timed bucket reductions (bytes, seconds) are all-gathered; rank 0 forms the agreed
  inputs (its own backward order, per-tensor median ready times, per-bucket max seconds), fits
  ``latency + bytes / bandwidth`` (``fusion.fit_cost_model``) unless ``fusion_cost`` is given,
  runs ``fusion.plan_buckets`` and broadcasts the plan, so all ranks hold the same plan.
  Sequence: step 1 one batch (order and sizes learnt) -> plan 'fallback' (size rule, no
  measurement needed) -> if the timed reductions so far span fewer than two sizes, one 'probe'
  step (one bucket per tensor) -> plan 'dp', kept until the set of tensors changes (then the
  sequence restarts). With ``fusion_cost`` configured, 'dp' follows step 1 directly.
- The plan is part of ``state_dict()`` (it decides which tensors are fused together, hence the
  numbers), so a run resumed from a checkpoint taken after planning repeats the uninterrupted
  run bit for bit; plans made from timings are not reproducible between separate runs.
"""
import logging
import threading
import time

import numpy as np

from hvdcomp import fusion
from hvdcomp.engine import SkipStep

MODES = ("step", "auto", "layerwise")
MAX_SAMPLES = 256
log = logging.getLogger("hvdcomp.fusion")


class FusionPlan:
    """The buckets in use: ``buckets`` (lists of tensor names, in processing order), ``bytes``
    (per bucket), ``rule`` ('fallback', 'probe', 'dp' or 'layerwise'), ``estimate`` (the model's
    step time in seconds, or None), ``latency``/``bandwidth`` (the cost model used, or None)."""

    def __init__(self, buckets, nbytes, rule, estimate=None, latency=None, bandwidth=None):
        self.buckets, self.bytes, self.rule = [list(b) for b in buckets], list(nbytes), rule
        self.estimate, self.latency, self.bandwidth = estimate, latency, bandwidth

    def as_dict(self):
        return {"buckets": [list(b) for b in self.buckets], "bytes": list(self.bytes),
                "rule": self.rule, "estimate": self.estimate, "latency": self.latency,
                "bandwidth": self.bandwidth}

    @classmethod
    def from_dict(cls, d):
        return cls(d["buckets"], d["bytes"], d["rule"], d.get("estimate"), d.get("latency"),
                   d.get("bandwidth"))

    def describe(self):
        sizes = "+".join(str(len(b)) for b in self.buckets)
        cost = ("" if self.latency is None else
                f", latency {self.latency * 1e3:.3f} ms, bandwidth {self.bandwidth / 1e6:.1f} MB/s")
        est = "" if self.estimate is None else f", est. {self.estimate * 1e3:.2f} ms"
        return (f"LayerFusion plan '{self.rule}': {len(self.buckets)} buckets "
                f"(tensors {sizes}; MB {', '.join(f'{b / 1e6:.2f}' for b in self.bytes)})"
                f"{cost}{est}")


def agree(rows):
    """The planner's inputs from every rank's measurements (a pure function; rank 0 runs it).

    ``rows``: per rank ``(order, ready, samples)``: tensor names in arrival order, their arrival
    times (seconds, any origin), and ``(reduction_id, nbytes, seconds)`` timed reductions (ids
    count the reductions, the same on every rank).
    Returns ``(order, backward_times, samples)``: rank 0's order; per-tensor backward time from
    the median over ranks of ready times relative to each rank's first arrival (made
    non-decreasing); per reduction ``(nbytes, max seconds over ranks)`` (a collective ends with
    its slowest rank).
    """
    order = list(rows[0][0])
    rel = []
    for names, ready, _ in rows:
        t0 = min(ready) if len(ready) else 0.0
        pos = dict(zip(names, ready))
        rel.append([pos.get(n, t0) - t0 for n in order])
    ready = np.median(np.asarray(rel, dtype=np.float64), axis=0) if order else np.zeros(0)
    ready = np.maximum.accumulate(ready) if order else ready
    backward = np.diff(np.concatenate([[ready[0] if order else 0.0], ready])) if order else ready
    merged = {}
    for _, _, samples in rows:
        for bid, nbytes, secs in samples:
            key = (bid, nbytes)
            merged[key] = max(merged.get(key, 0.0), secs)
    samples = [(nb, s) for (_, nb), s in sorted(merged.items())]
    return order, [float(b) for b in backward], samples


def make_plan(order, sizes, backward, samples, rule, cost=None):
    """A ``FusionPlan`` over ``order`` (names, backward order) with per-tensor ``sizes`` (bytes):
    rule 'fallback' (size rule), 'probe'/'layerwise' (one bucket per tensor) or 'dp' (cost from
    ``cost`` or fitted on ``samples``)."""
    n = len(order)
    if rule in ("probe", "layerwise"):
        ranges, est, lat, bw = fusion.layerwise(n), None, None, None
    elif rule == "fallback":
        ranges, est, lat, bw = fusion.plan_buckets(sizes).buckets, None, None, None
    else:
        lat, bw = cost if cost is not None else fusion.fit_cost_model(*zip(*samples))
        p = fusion.plan_buckets(sizes, backward, latency=lat, bandwidth=bw)
        ranges, est = p.buckets, p.time
    return FusionPlan([order[lo:hi] for lo, hi in ranges],
                      [int(sum(sizes[lo:hi])) for lo, hi in ranges], rule, est, lat, bw)


class StepDriver:
    """Cuts one runtime's steps into batches for its ``engine`` (see the module docstring):
    ``mode`` ('step', 'auto' or 'layerwise'), ``cost`` (LayerFusion's given ``(latency s,
    bandwidth B/s)``, checked by ``hvdcomp.validate.fusion_cost``, or None: fitted)."""

    def __init__(self, engine, mode, cost=None):
        if mode not in MODES:
            raise ValueError(f"fusion must be one of {MODES}, got {mode!r}")
        self.engine, self.mode, self.cost = engine, mode, cost
        self.one_batch = mode == "step"  # every step is one batch, reduced at its end
        self.plan = None
        self.samples = []  # (reduction id, bytes, seconds) of timed reductions
        self.count = 0  # timed reductions so far (the same sequence on every rank)
        self._cv = threading.Condition()
        self._reset_step()
        self._thread = None

    def plan_dict(self):
        """The LayerFusion plan in use (dict: 'buckets' (lists of tensor names, in processing
        order), 'bytes', 'rule', 'estimate', 'latency', 'bandwidth'), or None (no plan yet, or
        ``fusion='step'``)."""
        return None if self.plan is None else self.plan.as_dict()

    def describe(self):
        """One line describing the buckets in use."""
        if self.one_batch:
            return "fusion='step' (one batch per step)"
        if self.plan is None:
            return f"fusion='{self.mode}', no plan yet (first step: one batch)"
        return self.plan.describe()

    def whole_step(self, entries):
        """Reduce ``entries`` (a whole step, any order) as one batch, the step ended by the
        engine (skipped or rolled back there on NaN/Inf or an error); the results wait in
        ``engine.results``. Graph front ends reduce every step this way, whatever the mode."""
        self.engine.process(sorted(entries, key=lambda e: e.key))

    # -- per step state ------------------------------------------------------------------------
    def _reset_step(self):
        self.open = False
        self.arrivals = []  # (name, time)
        self.bucket_of = {}
        self.members = []  # per bucket: entries arrived so far
        self.done = []  # per bucket: processed by the worker
        self.closed = False
        self.working = False
        self.error = None
        self.step_stats = []
        self.step_samples = []

    def arrived(self, entry):
        """``compress()`` saw ``entry`` (called under the compressor's lock)."""
        if self.one_batch:
            return
        with self._cv:
            if not self.open:
                self.open = True
                if self.plan is not None:
                    self.bucket_of = {n: i for i, b in enumerate(self.plan.buckets) for n in b}
                    self.members = [[] for _ in self.plan.buckets]
                    self.done = [False] * len(self.plan.buckets)
                    self.working = True
                    self._ensure_thread()
                    self._cv.notify_all()
            self.arrivals.append((entry.key, time.perf_counter()))
            b = self.bucket_of.get(entry.key)
            if b is not None:
                self.members[b].append(entry)
                if len(self.members[b]) == len(self.plan.buckets[b]):
                    self._cv.notify_all()

    # -- the worker ----------------------------------------------------------------------------
    def _ensure_thread(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="hvdcomp-fusion", daemon=True)
            self._thread.start()

    def _run(self):
        while True:
            with self._cv:
                while not self.working:
                    self._cv.wait()
            try:
                self._work_step()
            except BaseException as exc:  # noqa: BLE001 - never die with the step unfinished
                self.error = self.error or exc
            finally:
                with self._cv:
                    self.working = False
                    self._cv.notify_all()

    def _work_step(self):
        for b, names in enumerate(self.plan.buckets):
            with self._cv:
                while len(self.members[b]) < len(names) and not self.closed:
                    self._cv.wait()
                if len(self.members[b]) < len(names):
                    return  # the step closed without this bucket: the rest goes in the final batch
                entries = sorted(self.members[b], key=lambda e: e.key)
            try:
                self._timed(entries)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                self.error = exc
                return
            self.done[b] = True

    def _timed(self, entries):
        """Reduce one batch, recording ``(id, bytes at 4 per element, seconds)``."""
        t0 = time.perf_counter()
        stats = self.engine.process(entries, end_step=False)
        self.count += 1
        self.step_samples.append((self.count, int(sum(4 * e.numel for e in entries)),
                                  time.perf_counter() - t0))
        self.step_stats.append(stats)

    # -- end of step (main thread, at the first decompress) ------------------------------------
    def finish_step(self, pending):
        """Reduce the step's ``pending`` entries (every compress of the step), raising or
        skipping the whole step as described in the module docstring."""
        if self.one_batch:
            self.whole_step(pending)
            return
        self._close()
        processed = {id(e) for b, ms in enumerate(self.members) if self.done[b] for e in ms}
        rest = sorted((e for e in pending if id(e) not in processed), key=lambda e: e.key)
        arrivals = self.arrivals
        try:
            if self.error is not None:
                raise self.error
            if rest:
                self._timed(rest)
        except SkipStep as skip:
            self.engine.skip_step(pending, self.step_stats, skip.nonfinite)
            self._end(arrivals, pending, skipped=True)
            return
        except BaseException:
            self.engine.abort_step(pending)
            self._reset_step()
            raise
        self.engine.end_step(self.step_stats)
        self._end(arrivals, pending, skipped=False)

    def _close(self):
        """Close the step and wait until the worker is done with it."""
        with self._cv:
            self.closed = True
            self._cv.notify_all()
            while self.working:
                self._cv.wait()

    def abandon(self, pending):
        """Drop the step under way (an error found before its end): wait for the worker, roll
        the step back (``engine.abort_step``). Returns the error the worker's collectives met
        meanwhile, if any (e.g. ``JoinError``: the other ranks have raised it too)."""
        if self.one_batch:
            return self.engine.abort_step(pending)
        self._close()
        found = self.error
        self.engine.abort_step(pending)
        self._reset_step()
        return found

    def _end(self, arrivals, pending, skipped):
        samples, plan = self.step_samples, self.plan
        self._reset_step()
        if skipped:
            return
        names = sorted(e.key for e in pending)
        if plan is not None and sorted(n for b in plan.buckets for n in b) == names:
            if plan.rule in ("dp", "layerwise"):
                return
        else:
            plan = None  # first step, or the set of tensors changed: start again
            self.samples = []
        self.samples = (self.samples + samples)[-MAX_SAMPLES:]
        self._replan(arrivals, {e.key: 4 * e.numel for e in pending}, plan)

    def _replan(self, arrivals, size_of, old):
        ctx = self.engine.context()
        mine = ([n for n, _ in arrivals], [t for _, t in arrivals], self.samples)
        rows = ctx.allgather_object(mine)
        new = None
        if ctx.rank == 0:
            order, backward, samples = agree(rows)
            sizes = [size_of[n] for n in order]
            if self.mode == "layerwise":
                rule = "layerwise"
            elif self.cost is not None:
                rule = "dp"
            elif old is None:
                rule = "fallback"
            elif len({nb for nb, _ in samples}) < 2 and old.rule == "fallback":
                rule = "probe"
            else:
                rule = "dp"
            new = make_plan(order, sizes, backward, samples, rule, self.cost).as_dict()
            log.info("%s: %s", self.engine.method.name, FusionPlan.from_dict(new).describe())
        self.plan = FusionPlan.from_dict(ctx.bcast_object(new))

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self):
        """What a checkpoint keeps (None for ``fusion='step'``: nothing)."""
        if self.one_batch:
            return None
        return {"mode": self.mode, "plan": None if self.plan is None else self.plan.as_dict(),
                "samples": [list(s) for s in self.samples], "count": self.count}

    def load(self, state):
        if not state:
            return
        self.plan = None if state.get("plan") is None else FusionPlan.from_dict(state["plan"])
        self.samples = [tuple(s) for s in state.get("samples", [])]
        self.count = int(state.get("count", 0))
