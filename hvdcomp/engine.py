"""The step engine: how one batch of gradients is reduced, the same way on every rank.

``StepEngine.process(entries)`` runs, for a batch sorted identically on every rank:

1. classify: each tensor goes ``dense`` (summed uncompressed: unsupported dtype, passed by the
   compress-or-pass decision (``hvdcomp.decision``: fewer than ``min_compress_numel`` elements
   always), or a preconditioner's warm-up; an entry ``by_horovod`` was
   summed by Horovod's own allreduce, or its message (``hvdcomp.stepaside``), and only takes
   part in the checks) or compressed, decided from
   what every rank must agree on (step 2 checks it), before the finite check, so a NaN on
   one rank cannot change the split; then each tensor's status (``checks.OK``/``NONFINITE``/
   ``UNSUPPORTED``) and whether it is all zeros (``Entry.zero``);
2. agree: the ranks hold the same (name, shape, dtype) list and compressor settings and reduce
   at the same loss scale (``checks.agree``; its all-gather also carries each rank's exchange
   window of the last step for the decision, which every rank then updates alike, and tells
   whether any rank has a tensor that is not OK, and which tensors are all zeros on every rank:
   gradients nobody computed, which are *absent* from the step: their result is zero, nothing of
   the method or the preconditioner runs for them and their state waits for their next
   gradient);
3. prepare: the working arrays divided by the loss scale (``hvdcomp.loss_scale``: methods and
   state see unscaled gradients), the error-feedback memory of a tensor the decision now passes
   added to what it sends (``carry_memories``), the preconditioner's ``before`` and the
   method's ``prepare`` (local work and the per-tensor scalars, nothing communicated, no state
   committed);
4. gather scalars: one all-gather of every tensor's status, the method's scalars and the size
   of the uncompressed sum, only where some rank has a tensor that is not OK or a memory was
   carried; otherwise the agreement's all-gather carried the sizes, and the method's scalars
   (Marsit, EF-signSGD, BinSGDM) are gathered alone, without waiting: the gather completes
   where the method reads them, after its own collective (``check_batch``; a compressed step
   waits on one all-gather of hvdcomp's checks);
5. check: ``checks.verdict`` raises on every rank, or asks for the step to be skipped;
6. reduce or dense: the method's ``reduce`` for compressed tensors, one fused float MPI
   all-reduce for the dense ones (``reduce_dense``); the preconditioner's ``after``; the results multiplied by
   the loss scale again (the user's unscale divides them);
7. land: the results are kept for ``decompress`` (``results``: ticket -> (flat array, entry));
   at the end of the step the state store commits (or rolls back a skipped or failed step).

A step is one batch, or several (LayerFusion buckets, ``hvdcomp.bucketing``): the scheduler then
calls ``process(..., end_step=False)`` per bucket and ends the step itself with ``end_step``,
``skip_step`` or ``abort_step``.
"""
import logging
import math
import time
from typing import NamedTuple, Optional

import numpy as np

from hvdcomp import checks, feedback, kernels, loss_scale, stepaside
from hvdcomp.backend import xp
from hvdcomp.comm import mean_allreduce
from hvdcomp.comm.context import Gathered
from hvdcomp.comm.link import measure as measure_link
from hvdcomp.decision import compresses_for_good
from hvdcomp.methods import contract
from hvdcomp.methods.contract import Batch
from hvdcomp.stats import StepStats, ring_bytes

log = logging.getLogger("hvdcomp")


class QuietSteps:
    """Which steps leave their batch to Horovod without hvdcomp's agreement (no collective of
    hvdcomp's, no finiteness pass): where the last agreement found every rank's whole batch
    summed by Horovod's own allreduce (``Entry.by_horovod``), the decision passing every tensor
    until its next observation (its choice, or the candidate its probe times) and NaN
    propagated (Horovod's sum carries it, as ``on_nonfinite='propagate'`` asks), every step
    but each ``every``-th (``EVERY`` after a step that was not quiet, doubled at each agreed
    step that allows quiet ones again, up to ``LONGEST``; ``PROBING`` while the decision
    probes, which then observes a quiet step every other step, but ``EVERY`` while its probe
    waits for the user's Adam's warm-up (``Decision.waiting``: nothing to time; on the emulated
    cluster an agreement every other step doubled those steps, 20-39 ms against Horovod's
    10-17 on 2026-12-03); every rank counts the same steps), for a batch of the same size, all
    by Horovod. Why: after Horovod's allreduce one more collective costs about as much as
    Horovod's whole allreduce of a small model (4 ranks, digits MLP: 5.4 ms/step under
    ``hvd.Compression.none``, 9 ms with an agreement every step; one every 16 steps still
    cost ~0.2 ms/step on this machine, 3 ms each). On the agreed
    steps the checks run as usual (a rank whose batch differs meets the others there, where the
    step numbers differ, and every rank raises) and the decision observes the window of the
    step before (``since``: the steps the observation stands for)."""
    EVERY, LONGEST, PROBING = 16, 128, 2

    def __init__(self):
        self.size, self.count = 0, 0  # the batch size of quiet steps (0: none may follow)
        self.every = self.EVERY

    def take(self, size, step, all_by_horovod):
        """Whether this step (``step`` completed before it; a batch of ``size`` tensors, every
        one summed by Horovod where ``all_by_horovod``) is quiet; counts it."""
        quiet = self.size == size and step % self.every != 0 and all_by_horovod
        self.count += quiet
        return quiet

    def expects(self, step):
        """Whether the step after ``step`` completed ones may be quiet (``take`` decides)."""
        return self.size > 0 and step % self.every != 0

    def ahead(self, step):
        """After a quiet step that brought the count to ``step`` and was silent (``expects``):
        how many of the steps that follow are quiet and silent too, as ``take`` and ``expects``
        will find them (nothing else changes this schedule before the next agreed step)."""
        if not self.expects(step):
            return 0
        return max(0, (step // self.every + 1) * self.every - 1 - step)

    def since(self):
        """At a step's first agreement: the steps since the last one (1 + the quiet steps)."""
        steps, self.count = 1 + self.count, 0
        return steps

    def agreed(self, entries, agreement, on_nonfinite, decision, ranks):
        """After a step's first agreement and the decision's observation (``entries``: the
        step's batch, none for a bucket of a step in several; ``ranks``: the set's size): may
        quiet steps follow, and how many? ``figures``: their ``StepStats`` fields."""
        quiet = agreement.all_by_horovod and on_nonfinite == "propagate" and decision.passes_all()
        again = quiet and self.size == len(entries) and self.every >= self.EVERY
        self.size = len(entries) if quiet else 0
        self.every = (self.EVERY if decision.waiting else
                      self.PROBING if decision.phase == "probe" else
                      min(2 * self.every, self.LONGEST) if again else self.EVERY)
        if quiet:
            self.figures = dict(ranks=ranks, elements=sum(e.numel for e in entries),
                                decision=decision.as_dict())


def warming(engine, entries):
    """``Decision.observe``'s ``warming`` for ``engine``'s step of ``entries``: whether a tensor
    it may compress, passed or not, is dense now for the preconditioner's warm-up
    (``makes_dense``: the user's Adam's first steps; the same on every rank)."""
    return any(e.numel >= engine.decision.min_numel and engine.pre.makes_dense(e, engine.store)
               for e in entries)


class SkipStep(Exception):
    """Raised by ``process(..., end_step=False)`` when the batch is to be skipped (NaN/Inf with
    ``on_nonfinite`` 'propagate' or 'skip'): the caller skips the whole step. ``nonfinite``:
    the keys of the non-finite tensors."""

    def __init__(self, nonfinite):
        super().__init__(sorted(nonfinite))
        self.nonfinite = set(nonfinite)


class Ticket:
    """The ``ctx`` Horovod hands back to ``decompress``."""
    __slots__ = ("key",)
    DEFERRED = False  # a graph front end's ctx (TensorFlow's ``Deferred``) says True

    def __init__(self, key):
        self.key = key


class HorovodSum(NamedTuple):
    """The result of an entry that Horovod's own allreduce sums (``Entry.by_horovod``):
    ``decompress`` returns Horovod's output as it is, or the step formed from it
    (``hvdcomp.stepaside``) (``fill`` None), or ``fill`` in every element (a skipped step: 0.0,
    or NaN for a non-finite tensor under 'propagate')."""
    fill: Optional[float] = None


SUMMED = HorovodSum()  # Horovod's output as it is: the result of every entry by_horovod

class Entry(contract.Entry):
    """One gradient of the current batch: what its method sees (``hvdcomp.methods.contract.Entry``)
    and what the engine keeps of it.

    ``work``: the flat float32 working array (for every input dtype), a NumPy array for host
    data or a torch tensor on the gradient's device (None for an unsupported dtype, and for an
    entry ``by_horovod``); the preconditioner may replace it by what it sends.
    ``by_horovod``: Horovod's own allreduce sums this tensor (``compress`` handed it to Horovod
    as it is, or its message, see ``hvdcomp.facade.horovod_sums``); hvdcomp holds it to the
    batch's agreement and finiteness verdict only: its status is set here, from the tensor as
    compress() saw it (the adapter's ``all_finite``; with ``defer``, where the step is expected
    to be quiet, only if it turns out not to be: ``status_now``), and its result is a
    ``HorovodSum``; ``half``: Horovod sums it in float16 this step
    (``hvdcomp.facade.runtime.Runtime.sent``).
    ``compensated``/``owned``: the error-compensated vector and whether it is a buffer the
    method may overwrite (``hvdcomp.feedback``); ``moments``: BinSGDM's new (m, v);
    ``own_scale``: Marsit's scale.
    ``gradient``: an optimizer's (or TensorFlow tape's) gradient, not a direct ``hvd.allreduce``
    (default: what ``identity`` says; None counts as a gradient): the step's loss scale applies
    to it (``hvdcomp.loss_scale``), and ``zero``: it is all zeros on this rank (``checks.agree``
    finds those zero on every rank: gradients nobody computed, left out of the step); ``adam``: the
    user's Adam/AdamW moments of the gradient's parameter (the adapter's ``adam_moments``, or
    the graph front end's ``adam`` where the adapter has none:
    ``steps()``, ``beta1``, ``exp_avg(like)``, ``set_exp_avg(m)``; ``hvdcomp.preconditioning.
    FollowAdam``), or None.
    ``into``/``target``: where the step's result may be written instead of a new array
    (``result_buffer``): a flat host view of the user's gradient ``target`` when the Horovod
    caller (``identity``) lets it be overwritten, as Horovod's own in-place allreduce of a
    DistributedOptimizer gradient does (the adapter's ``result_target``); else None.
    """
    __slots__ = ("ticket", "adapter", "dtype", "device", "dtype_name", "status", "dense",
                 "by_horovod", "target", "zero", "_signature", "source", "half")

    def __init__(self, key, tensor, adapter, by_horovod=False, identity=None, gradient=None,
                 adam=None, defer=False):
        self.key, self.ticket, self.adapter = key, Ticket(key), adapter
        self.shape, self.dtype, self.device = adapter.meta(tensor)
        self.dtype_name = adapter.describe_dtype(tensor)
        self.numel = math.prod(self.shape)
        self.by_horovod = self.dense = by_horovod
        self.source, self.half = None, False
        if by_horovod:
            self._read_status(tensor, defer)
            self.work = None
        else:
            self.status = checks.OK if adapter.is_supported(tensor) else checks.UNSUPPORTED
            self.work = adapter.working(tensor, "float32") if self.status == checks.OK else None
        self.into = None if self.work is None else adapter.result_target(tensor, identity)
        self.target = None if self.into is None else tensor
        self.compensated = self.owned = self.moments = self.own_scale = None
        self.zero = False
        self.gradient = (identity is None or identity.optimizer is not None) \
            if gradient is None else gradient
        moments = getattr(adapter, "adam_moments", lambda identity: adam)
        # by_horovod too: whether the user's Adam is in its warm-up (``warming``)
        self.adam = None if self.work is None and not by_horovod else moments(identity)
        self._signature = None

    def signature(self):
        """``name|shape|dtype`` and a newline, as bytes: what ``checks.fingerprint`` hashes
        (made once per entry; a renewed entry keeps its name, shape and dtype)."""
        if self._signature is None:
            self._signature = f"{self.key}|{tuple(self.shape)}|{self.dtype_name}\n".encode()
        return self._signature

    def renew(self, tensor, defer=False):
        """Make this entry ``by_horovod`` the entry of ``tensor``, the same key's gradient in a
        later step (``StepEngine.entry``): False, and nothing changed, unless ``tensor`` has the
        entry's shape, dtype and device; else its status is re-read and True returned."""
        if self.adapter.meta(tensor) != (self.shape, self.dtype, self.device):
            return False
        self._read_status(tensor, defer)
        return True

    def _read_status(self, tensor, defer):
        """The status of an entry ``by_horovod`` (finite or not), or, with ``defer`` (the step
        is expected to be quiet, ``QuietSteps``, where nothing reads it), None and ``source``
        kept for ``status_now``."""
        if defer:
            self.status, self.source = None, tensor
        else:
            self.status = checks.OK if self.adapter.all_finite(tensor) else checks.NONFINITE

    def status_now(self):
        """Read a deferred status (``_read_status``): the step was not quiet after all. Horovod
        may have summed the tensor in place by now: a rank's NaN/Inf is still in it."""
        if self.status is None:
            self._read_status(self.source, False)
            self.source = None

    def release(self):
        """Drop the step's arrays (the result is kept elsewhere; it may be ``into``)."""
        self.work = self.compensated = self.moments = None

    def restore(self, flat, factor=1):
        """``flat`` (this entry's result) times ``factor`` as a tensor like the input: the
        input itself when the result was written into it (``into``)."""
        if flat is self.into:
            if factor != 1:
                flat *= factor
            return self.target
        if factor != 1:
            flat = flat * factor
        return self.adapter.restore(flat, self.shape, self.dtype, self.device)



def observe(engine, ctx, entries, agreed):
    """The decision observes the step's first agreement (``hvdcomp.decision.Decision.observe``):
    the last step's agreed window; the float16 pass offered where Horovod sums every tensor, its
    NaN/Inf propagated; the link measured on hvdcomp's communicator at its first observation
    (where the job's first ``entry`` did not measure it: graph front ends, whose first
    agreement runs before Horovod sums anything)."""
    engine.decision.observe(
        agreed.window, [e.numel for e in entries], speak=ctx.rank == 0,
        steps=engine.quiet.since(), warming=lambda: warming(engine, entries),
        link=lambda: measure_link(ctx.comm),
        half=agreed.all_by_horovod and not engine.aside and engine.on_nonfinite == "propagate"
        and all(hasattr(e.adapter, "halved") for e in entries))


class KernelLoading:
    """When the step engine loads the fused kernels (``hvdcomp.kernels``) its method's host path
    uses (``Method.kernel_modules``) and ``finite`` (the check of the tensors Horovod sums,
    ``Entry.by_horovod``, through the adapter's ``all_finite``: ~3 us per tensor, where NumPy's
    costs ~10 us): where compressing pays, so that a job that passes every gradient never pays
    numba's import and target initialisation (~1 s per process: on 4 ranks of 2 cores, 1.5-3.5 s
    before a 3-5 s training's first step). That is at once where numba is loaded already
    (another compressor, BinSGDM's constructor) or the decision compresses for good (mode
    'compress'); else at the first step after the decision holds a choice that compresses, or
    puts a compressing candidate in force in its probe's second round (a finalist, whose samples
    then time the kernels: the first round times it on the reference path, which can only make
    a candidate look slower than it is, by its encode and decode only) once the job has run
    ``AFFORDED`` seconds since the decision's first timed step, so that the load costs at most a
    tenth of the time so far. Sooner, the finalist is timed on the reference path: where it
    wins anyway, the held choice loads them; where it loses, the decision's later revisits time
    it again, with the kernels once affordable. Why: recipe (d) (Keras ``fit``, 220 steps of
    ~10 ms, 4 ranks on 2 cores) loaded them in 3 of 9 runs for a finalist that then lost, at a
    cost of 2-3 s (numba's import and the kernels' load, and the one more full collection of
    Python's garbage collector that their objects brought, 0.4-0.7 s) in a job of 9-10 s.
    Until then the methods run their NumPy reference path (the same bits:
    ``hvdcomp.kernels``) and the check is NumPy's (the same verdict), on the steps hvdcomp
    agrees only (``QuietSteps`` check nothing). Loading happens at a step's first ``entry``
    (before the decision's window begins) or, for a graph front end, its first batch."""
    LOAD_SECONDS = 1.0  # numba's import and a method's kernels from numba's disk cache (0.7 s
    # measured in one process on this 2-core machine; 4 ranks loading together: 2-3 s)
    AFFORDED = 10 * LOAD_SECONDS
    clock = staticmethod(time.perf_counter)

    def __init__(self, method, decision):
        self.modules = ("finite",) + tuple(getattr(method, "kernel_modules", ()))
        self.due = kernels.numba_loaded()  # loading them then costs ~0.1 s, not numba's import
        self.loaded = not kernels.installed()  # nothing to load
        self.since = None  # when the decision observed its first timed step
        self.observe(decision)
        self.load_if_due()

    def observe(self, decision):
        """After the decision's observation of a step: are the kernels due?"""
        now = self.clock()
        if self.since is None and decision.steps:
            self.since = now
        wanted = compresses_for_good(decision) and (
            decision.phase != "probe" or self.since is not None
            and now - self.since >= self.AFFORDED) or decision.favours_method()
        self.due = not self.loaded and (self.due or wanted)

    def load_if_due(self):
        """Load them where they are due (between steps), once."""
        if self.due:
            for module in self.modules:
                kernels.warm(module)
            self.due, self.loaded = False, True


class StepEnding:
    """How a step ends, on a ``StepEngine``: committed (``end_step``), skipped for NaN/Inf
    (``skip_step``: the state rolled back, the results what ``on_nonfinite`` says), aborted by an
    error (``abort_step``: rolled back, no result kept) or quiet (``pass_quietly``: every result
    Horovod's own); each counts the step and its figures (``last_stats``, ``total_stats``)."""

    def pass_quietly(self, horovod_bytes):
        """A quiet step (``QuietSteps``): every result is Horovod's own (``SUMMED``), nothing is
        staged or communicated; the step ends with the figures of the agreed step that allowed
        it, and ``horovod_bytes``, what Horovod's allreduce sent (a tensor may be summed in
        float16, ``Entry.half``)."""
        t0 = time.perf_counter()
        self.decision.begin()  # where no compress() came first
        self.atypical = False
        self.decision.step_done()
        self.step += 1
        self.last_stats = stats = StepStats(
            steps=1, step=self.step, seconds=time.perf_counter() - t0,
            horovod_bytes=horovod_bytes, **self.quiet.figures)
        self.total_stats.add(stats)
        return stats

    def end_step(self, batch_stats):
        """End a step reduced in one or several batches: commit the state, count one step,
        set ``last_stats``."""
        self.store.commit()
        self.pre.land()
        self.decision.step_done(typical=not self.atypical)
        self.batch = 0
        self.step += 1
        step = StepStats(steps=1, step=self.step, ranks=self.context().size)
        for s in batch_stats:
            step.add(s)
        step.steps, step.step = 1, self.step
        self.last_stats = step
        self.total_stats.add(step)

    def skip_step(self, entries, batch_stats, nonfinite):
        """End a step skipped for NaN/Inf in the tensors ``nonfinite`` (keys): the state is
        rolled back; every entry's result is what ``unapplied`` gives."""
        self._rollback()
        self.skipped += 1
        for e in entries:
            done = self.results.get(e.ticket)
            like = done[0] if done is not None else e.work
            self.results[e.ticket] = (unapplied(e, like, e.key in nonfinite, self.on_nonfinite),
                                      e)
            e.release()
        self.end_step(batch_stats)

    def _rollback(self):
        """Drop the step's staged state (the store's and the preconditioner's)."""
        self.store.rollback()
        self.pre.drop()

    def abort_step(self, entries):
        """Forget a step that raised: the state is rolled back, no result is kept."""
        self._rollback()
        self.batch = 0
        self.decision.step_done(typical=False)
        for e in entries:
            self.results.pop(e.ticket, None)
            e.release()


class StepEngine(StepEnding):
    """Reduces batches for one ``method`` (``hvdcomp.methods.contract.Method``, or a wrapper with its
    contract: ``name``, ``n_scalars``, ``prepare(batch)``, ``reduce(batch, scalars)``), with
    ``preconditioner`` (``hvdcomp.preconditioning``: ``makes_dense``, ``before``, ``after``),
    ``store`` (a ``StateStore``), ``decision`` (a ``hvdcomp.decision.Decision``: which tensors it
    compresses), ``describe`` (a callable: the settings every rank must agree on) and ``ranks``
    (the world ranks of the process set it reduces over, a sorted tuple; None: every rank) or
    ``context`` (its ``CommContext``: a torch.distributed group's, ``hvdcomp.ddp``). The state
    is the set's: an engine serves one set (``hvdcomp.facade.runtime``). Its steps end through
    ``StepEnding``."""

    def __init__(self, method, store, preconditioner, decision, on_nonfinite, describe,
                 ranks=None, context=None):
        self.method, self.store, self.pre = method, store, preconditioner
        self.describe, self.ranks, self.ctx = describe, ranks, context
        # a tensor the decision passes adds its memory (the method's own carry where it has one,
        # after its collective set-up for it, on every rank alike: node stages' layout)
        self.carry = getattr(method, "carry", feedback.carry)
        self.carry_ready = getattr(method, "carry_ready", lambda ctx: None)
        self.aside = stepaside.applies(method)  # its passed tensors send messages instead
        self.decision, self.on_nonfinite = decision, on_nonfinite
        self.step = 0  # completed steps
        self.batch = 0  # index of the next batch within the step
        self.skipped = 0
        self.scale = 1.0  # the loss scale of the step under way (hvdcomp.loss_scale)
        # the step is not typical of the decision's candidate: some tensor is dense for a
        # preconditioner's warm-up, or a passed tensor carries its memory (the first passed step)
        self.atypical = False
        self.quiet = QuietSteps()
        self.results = {}  # ticket -> (flat result, entry)
        self.summed = {}  # key -> the Entry by_horovod of its last step (see entry())
        self.phases = {}
        self.last_stats, self.total_stats = None, StepStats()
        self.kernels = KernelLoading(method, decision)

    def phase(self, name):
        """A ``with`` block whose wall time is added to this batch's ``phases[name]``."""
        return _Phase(self.phases, name)

    def context(self):
        """The ``CommContext`` this engine reduces over (a Horovod process set's: the world's by
        default)."""
        return self.ctx if self.ctx is not None else checks.context(self.method.name, self.ranks)

    def entry(self, key, tensor, adapter, by_horovod=False, identity=None, adam=None):
        """The ``Entry`` of ``tensor`` (named ``key``) for this step. One ``by_horovod`` is the
        key's entry of its last step, renewed (``Entry.renew``), where the shape, dtype and
        device are unchanged and its result was taken: a model of a thousand small tensors then
        creates no object per tensor per step that would outlive the backward pass, so Python's
        full garbage collections (~120 ms each with torch and numba loaded) stay as rare as
        under Horovod's own allreduce (with a new entry per tensor per step they came every ~30
        steps: ~4 ms per step). ``adam``: Entry's (a renewed entry takes it). The step's first
        call starts the decision's timing window."""
        self.kernels.load_if_due()  # before the window begins: no candidate's cost
        if self.decision.wants_link():  # the job's first entry: nothing on the link yet
            self.decision.link = measure_link(self.context().comm)
        self.decision.begin()
        defer = by_horovod and self.quiet.expects(self.step)  # its status: nothing reads it
        if by_horovod:
            kept = self.summed.get(key)
            if (kept is not None and kept.ticket not in self.results
                    and kept.renew(tensor, defer)):
                kept.adam = adam or kept.adam
                return kept
        made = Entry(key, tensor, adapter, by_horovod, identity, adam=adam, defer=defer)
        if by_horovod:
            self.summed[key] = made
        return made

    def take(self, ticket):
        """``(flat result, entry)`` of ``ticket``, removed from ``results``: handed to the caller,
        which ends the step's exchange for that tensor (the decision's window ends at the last)."""
        self.decision.mark()
        return self.results.pop(ticket)

    def forget(self, key):
        """Drop ``key``'s state and kept entry (its parameter is gone)."""
        self.store.forget(key)
        self.summed.pop(key, None)

    def process(self, entries, end_step=True):
        """Reduce ``entries`` (sorted identically on every rank) and keep their results. With
        ``end_step=False`` (one bucket of a step) the step is not ended and a batch to skip
        raises ``SkipStep``. Returns the batch's ``StepStats``."""
        if self.batch == 0:
            self.kernels.load_if_due()  # a graph front end's (no entry() came first)
        if end_step and self.batch == 0 and self.quiet.take(
                len(entries), self.step, all(e.by_horovod for e in entries)):
            for e in entries:
                self.results[e.ticket] = (SUMMED, e)
                e.source = None
            return self.pass_quietly(horovod_bytes(entries, self.quiet.figures["ranks"]))
        ctx = self.context()
        before, t0 = ctx.stats.snapshot(), time.perf_counter()
        self.phases = {}
        try:
            outputs, big = self._reduce_batch(ctx, entries, end_step)
        except BaseException:
            if end_step:
                self.abort_step(entries)
            raise
        for e, out in zip(entries, outputs):
            self.results[e.ticket] = (out, e)
            e.release()
        moved = ctx.stats.since(before)
        stats = StepStats.of_step(
            step=self.step + 1, ranks=ctx.size, elements=sum(e.numel for e in entries),
            compressed_elements=sum(e.numel for e in big), bytes_sent=moved.bytes_sent,
            bytes_recv=moved.bytes_recv, rounds=moved.rounds, seconds=time.perf_counter() - t0,
            phases=self.phases,
            horovod_bytes=horovod_bytes(entries, ctx.size),
            decision=self.decision.as_dict())
        if end_step:
            self.end_step([stats])
        else:
            self.batch += 1
        return stats

    def _reduce_batch(self, ctx, entries, end_step):
        """Steps 1-6 of the module docstring: ``(outputs in entries' order, compressed entries)``."""
        name = self.method.name
        first = self.batch == 0
        if first:
            self.scale = loss_scale.current()
            self.decision.begin()  # where no compress() came first (graph front ends)
        self.atypical = self._classify(entries) or (self.atypical and not first)
        agreed = checks.agree(ctx, entries, name, self.step, self.describe(), self.scale,
                              self.decision.last_window if first else 0.0,
                              dense=dense_elements(entries))
        if first:
            observe(self, ctx, entries, agreed)
            self.quiet.agreed(entries if end_step else (), agreed, self.on_nonfinite,
                              self.decision, ctx.size)
            self.kernels.observe(self.decision)
        absent = [entries[i] for i in sorted(agreed.absent)]
        live = [e for i, e in enumerate(entries) if i not in agreed.absent] if absent else entries
        big = [e for e in live if not e.dense]
        small = [e for e in live if e.dense and not e.by_horovod]
        rescaled = unscale(live, self.scale)
        passed = [e for e in small if e.numel >= self.decision.min_numel]  # by the decision
        carried = not self.aside and carry_memories(self, ctx, passed)
        self.atypical = carried or self.atypical
        view = Batch(big, ctx, self.store, self.step, self.batch, self.phase)
        with self.phase("encode"):
            self.pre.before([e for e in live if e.status == checks.OK], self.store)
            scalars = self.method.prepare(view) if big else ()
            n = self.method.n_scalars  # read after prepare, which may set it (the contract)
            scalars = np.asarray(scalars, dtype=np.float64).reshape(len(big), n)
        bad, all_scalars = check_batch(self, ctx, agreed, (entries, small), scalars, carried)
        if bad:
            if ctx.rank == 0:
                report_nonfinite(self, [(r, entries[i].key) for r, i in bad])
            nonfinite = {entries[i].key for _, i in bad}
            if not end_step:
                raise SkipStep(nonfinite)
            self._rollback()
            self.skipped += 1
            return [unapplied(e, e.work, e.key in nonfinite, self.on_nonfinite)
                    for e in entries], big
        reduced = {e.key: unapplied(e, e.work, False, self.on_nonfinite) for e in absent}
        aside = send_messages(self, passed) if self.aside else ()
        try:
            if big:
                reduced.update(zip((e.key for e in big), self.method.reduce(view, all_scalars)))
        finally:
            all_scalars.wait()  # a gather in flight completes (check_batch)
        reduced.update(zip((e.key for e in small), reduce_dense(ctx, small, self.phase)))
        for e in aside:  # their messages' means (hvdcomp.stepaside)
            reduced[e.key] = stepaside.step(self.method, reduced[e.key], e, ctx.size)
        reduced.update((e.key, SUMMED) for e in entries if e.by_horovod)
        self.pre.after(live, reduced, self.store, self.phase)
        for e in rescaled:
            reduced[e.key] *= self.scale
        return [reduced[e.key] for e in entries], big

    def _classify(self, entries):
        """Step 1 of the module docstring for ``entries``; returns whether some tensor is dense
        for a preconditioner's warm-up (the step is not typical of the decision's candidate)."""
        warming = False
        for e in entries:
            if e.by_horovod:
                e.status_now()
                continue
            passed = not self.decision.compresses(e.numel)
            e.dense = e.status != checks.OK or passed or self.pre.makes_dense(e, self.store)
            warming = warming or (e.dense and not passed and e.status == checks.OK)
            if e.status == checks.OK:
                finite, zero = xp.finite_and_zero(e.work)
                e.zero = zero and e.gradient
                if not finite:
                    e.status = checks.NONFINITE
        return warming


def pass_planned(engine, numels):
    """A graph front end's step, at its start, whose plan hands its whole batch (float32
    tensors of ``numels`` elements) to Horovod's own allreduce: ``(quiet, silent)``, whether
    it is quiet (``QuietSteps``: it ends now, and no batch of it is processed) and whether it
    is also silent: the next step may be quiet too, so nothing reads this one's exchange window
    (a step that is not quiet observes the window before it, which a result of that step must
    then end, ``Decision.mark``)."""
    quiet = engine.batch == 0 and engine.quiet.take(len(numels), engine.step, True)
    if not quiet:
        return False, False
    engine.pass_quietly(ring_bytes(4 * sum(numels), engine.quiet.figures["ranks"]))
    return True, engine.quiet.expects(engine.step)


class QuietGrant:
    """Quiet steps granted ahead to a graph front end (``grant``), which ends them in its graph
    without running Python and counts them down (``countdown``, the front end's: ``start(n)``,
    it may end the next ``n`` steps; ``left()``, how many of them it has not ended). ``settle``
    then counts the ones it ended, each as ``pass_planned`` would have (the same figures, step
    numbers and decision calls), before anything reads or uses the engine. Why: a countdown
    costs a step a few graph ops where a plan op costs it a Python call (Keras recipe (d), 6
    tensors: ~0.7 ms of a 4-5 ms step). ``given``: the steps granted last; ``counted``: how
    many of them ``settle`` has counted; ``numels``: their batch's tensor sizes."""

    def __init__(self):
        self.given, self.counted, self.numels = 0, 0, ()
        self.countdown = None

    def grant(self, engine, numels, quiet_and_silent):
        """At a graph front end's plan (after ``pass_planned``), with its ``countdown`` (set
        before): the steps that follow which it may end itself (``QuietSteps.ahead``; none
        unless this one was ``quiet_and_silent``), started on the countdown."""
        self.given = engine.quiet.ahead(engine.step) if quiet_and_silent else 0
        self.counted, self.numels = 0, tuple(numels)
        if self.given:
            self.countdown.start(self.given)
        return self.given

    def settle(self, engine, drop=False):
        """Count the granted steps the countdown has ended since the last call; ``drop``: the
        engine is about to run a step of its own, so the countdown may end no more."""
        if not self.given:
            return
        ended = self.given - int(self.countdown.left())
        for _ in range(ended - self.counted):
            if pass_planned(engine, self.numels) != (True, True):
                raise AssertionError("hvdcomp: a granted step is not quiet and silent")
        self.counted = ended
        if drop:
            self.given = self.counted = 0
            self.countdown.start(0)


def send_messages(engine, passed):
    """For a method that steps aside (``hvdcomp.stepaside``): each finite tensor of ``passed``
    sends its message instead of its gradient, its new state staged. Returns those entries (a
    list, possibly empty)."""
    live = [e for e in passed if e.status == checks.OK]
    for e in live:
        e.work, new_state = stepaside.message(engine.method, e.work, e.key, engine.store,
                                              e.adam is not None)
        engine.store.put(e.key, new_state)
    return live


def dense_elements(entries):
    """The elements of this rank's uncompressed sum of ``entries`` (classified, step 1), as the
    agreement carries them: its OK entries that hvdcomp sums uncompressed."""
    return sum(e.numel for e in entries if not e.by_horovod and e.dense and e.status == checks.OK)


def check_batch(engine, ctx, agreed, batch, scalars, carried):
    """Steps 4-5 of the module docstring for ``batch`` (the entries, and those summed
    uncompressed): ``(bad, every rank's scalars)``, the latter a ``Gathered`` of shape
    ``(ranks,) + scalars.shape``. ``gather_checked``'s all-gather only where the agreement
    flagged a status that is not OK or a memory was ``carried`` (it may change a size); else
    every status is OK everywhere, the sizes the agreement carried are checked, and the
    method's ``scalars`` (where it has some) are gathered alone, started here and completed
    where the method reads them (after its own collective, which the gather's round trip then
    overlaps)."""
    if agreed.flagged or carried:
        bad, gathered = gather_checked(engine, ctx, *batch, scalars)
        return bad, Gathered.of(gathered)
    checks.same_dense_size(agreed.dense_sizes, engine.method.name, engine.step, ctx.rank)
    if not scalars.size:
        return [], Gathered.of(np.zeros((ctx.size,) + scalars.shape))
    shape = (ctx.size,) + scalars.shape
    return [], ctx.iallgather_array(scalars.reshape(-1)).then(lambda a: a.reshape(shape))


def gather_checked(engine, ctx, entries, small, scalars):
    """Steps 4-5 of the module docstring for ``engine``'s batch ``entries``: one all-gather of
    every entry's status, the method's ``scalars`` (per compressed entry) and the element count
    of this rank's uncompressed sum (``small``'s working arrays); ``checks.verdict`` on the
    statuses (raises, or returns the non-finite ``(rank, entry index)`` pairs), then, where
    none is, ``checks.same_dense_size``. Returns ``(bad, every rank's scalars)``."""
    name, step = engine.method.name, engine.step
    dense = sum(math.prod(e.work.shape) for e in small if e.status == checks.OK)
    gathered = ctx.allgather_array(
        np.concatenate([[e.status for e in entries], scalars.reshape(-1), [dense]]))
    statuses = gathered[:, :len(entries)].astype(np.int64)
    bad = checks.verdict(entries, statuses, name, step, engine.on_nonfinite, ctx.rank)
    if not bad:
        checks.same_dense_size(gathered[:, -1], name, step, ctx.rank)
    return bad, gathered[:, len(entries):-1].reshape((ctx.size,) + scalars.shape)


def carry_memories(engine, ctx, passed):
    """Add to what each tensor of ``passed`` (sent uncompressed by the compress-or-pass decision)
    sends the error-feedback memory its compressed steps left (``engine.carry`` through the
    preconditioner's ``carry``), after the method's set-up for it (``engine.carry_ready``),
    where some rank may hold one (``feedback.pending``: alike on every rank). Returns whether a
    memory was carried (the step is then not typical of the decision's candidate)."""
    carrying = [e for e in passed if feedback.pending(engine.store, e.key)]
    if carrying:
        engine.carry_ready(ctx)
    live = [e for e in carrying if e.status == checks.OK]
    for e in live:
        engine.pre.carry(engine.carry, engine.store, e)
    return bool(live)


def unscale(entries, scale):
    """Divide the working arrays of ``entries`` that the step's loss ``scale`` applies to by it
    (in place where the array is the user's gradient, which the result overwrites anyway;
    else into a new array), so that methods and state see unscaled gradients; returns those
    entries, whose results are to be multiplied by the scale again (``hvdcomp.loss_scale``)."""
    if scale == 1.0:
        return ()
    inverse = 1.0 / scale
    out = [e for e in entries if e.gradient and not e.by_horovod and e.status == checks.OK]
    for e in out:
        if e.into is not None:  # a view of the user's gradient, as ``work``
            e.work *= inverse
        else:
            e.work = e.work * inverse
    return out


def unapplied(entry, like, nonfinite, on_nonfinite):
    """The result of ``entry`` (shaped ``like``) in a skipped step: NaN where the tensor was
    non-finite on some rank and ``on_nonfinite='propagate'`` (what Horovod's own allreduce
    returns, so AMP's GradScaler sees the overflow and backs off), else zeros (nothing
    applied)."""
    fill = float("nan") if nonfinite and on_nonfinite == "propagate" else 0.0
    if entry.by_horovod:
        return HorovodSum(fill)
    if like is None:
        return None
    out = xp.zeros_like(like)
    if fill:  # NaN
        out[...] = fill
    return out


def report_nonfinite(engine, where):
    """Log (rank 0) the skipped step's non-finite tensors and ranks (``where``: (rank, key)
    pairs) on the 1st, 2nd, 4th, 8th, ... such step of ``engine`` (overflows are routine under
    AMP)."""
    count = engine.skipped + 1
    if count & (count - 1):
        return
    shown = ", ".join(f"{k!r} on rank {r}" for r, k in where[:8])
    more = f" and {len(where) - 8} more" if len(where) > 8 else ""
    log.warning("%s: step %d skipped (non-finite step number %d): NaN/Inf in %s%s; the "
                "compressor state is unchanged, the step returns %s",
                engine.method.name, engine.step, count, shown, more,
                "NaN for those tensors" if engine.on_nonfinite == "propagate" else "zeros")


def horovod_bytes(entries, ranks):
    """What Horovod's ring allreduce sends per rank for the ``entries`` it sums."""
    return ring_bytes(sum(e.numel * (2 if e.half else 8 if e.dtype_name == "float64" else 4)
                          for e in entries if e.by_horovod), ranks)


def reduce_dense(ctx, entries, phase):
    """Mean over ranks of ``entries``' working arrays, fused and summed uncompressed (float32, or
    float64 when any of them is float64) by one MPI all-reduce (``mean_allreduce``)."""
    if not entries:
        return []
    wide = any("float64" in e.dtype_name for e in entries)
    with phase("comm"):
        means = mean_allreduce(ctx, [xp.to_host(e.work) for e in entries],
                               np.float64 if wide else np.float32)
    return [xp.from_host(m, e.work) for m, e in zip(means, entries)]


class _Phase:
    """Adds the wall time of a ``with`` block to ``phases[name]``."""

    def __init__(self, phases, name):
        self.phases, self.name = phases, name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.phases[self.name] = self.phases.get(self.name, 0.0) + time.perf_counter() - self.t0
