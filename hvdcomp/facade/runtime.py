"""A compressor reified for one Horovod process set, as Bagua reifies an algorithm per process
group: ``Runtime``; a compressor's runtimes: ``Runtimes``.

A compressor (``hvdcomp.facade.BatchedCompressor``) holds what the user set. The first tensor
it meets in a process set (Horovod's global set included) makes that set's ``Runtime``: a copy
of the method (its settings; what it derives from the set, such as BinSGDM's node layout or its
momentum under SGD, its own), the preconditioner, the state store, the compress-or-pass
decision, the step engine bound to the set's communicator, the step driver, the entries
``compress`` recorded since the step's last flush, and the owners of its state
(``hvdcomp.facade.ownership``). One compressor, the bare class's default instance included, thus
serves every process set it is used in; each set's steps, statistics and checkpoint are its own.
"""
import copy

import numpy as np

from hvdcomp import (bucketing, feedback, hierarchical, loss_scale, preconditioning, state,
                     stepaside)
from hvdcomp.facade import ownership
from hvdcomp.decision import Decision
from hvdcomp.engine import QuietGrant, StepEngine
from hvdcomp.errors import HvdcompError


class Runtime:
    """``compressor``'s runtime for the process set of world ``ranks`` (a sorted tuple; None:
    every rank): ``algorithm`` (its copy of the method), ``preconditioner``, ``store``,
    ``decision``, ``engine``, ``driver``, ``pending`` (key -> ``Entry`` recorded by ``compress``
    since the step's last flush), ``held`` (key -> the new state of a tensor whose message
    Horovod sums, ``message``), ``ownership`` and ``ahead``, the quiet steps a graph front end
    may end itself (``hvdcomp.engine.QuietGrant``; ``settle`` counts them). ``context``: the
    ``CommContext`` to reduce over instead of the set's MPI one (``hvdcomp.ddp``)."""

    def __init__(self, compressor, ranks, context=None):
        c = compressor
        self.compressor, self.ranks, self.method = c, ranks, c.method
        self.algorithm = copy.copy(c.algorithm)
        self.preconditioner = self.algorithm.preconditioner = preconditioning.make(
            c.precondition_setting, self.algorithm.under_adam)
        self.store = state.StateStore()
        # a method whose result is the step passes only where it steps aside (hvdcomp.stepaside)
        passes = self.returns_step() is None or stepaside.applies(self.algorithm)
        self.decision = Decision(c.decision_mode if passes else "compress", c.min_compress_numel)
        self.engine = StepEngine(hierarchical.wrap(self.algorithm, c.hierarchy_mode), self.store,
                                 self.preconditioner, self.decision, c.on_nonfinite,
                                 self.describe, ranks, context)
        self.driver = bucketing.StepDriver(self.engine, c.fusion_mode, c.fusion_cost)
        self.pending = {}
        self.held = {}  # key -> new state of a tensor stepping aside through Horovod (message)
        self.ownership = ownership.Ownership(self)
        self.ahead = QuietGrant()

    def settle(self, drop=False):
        """Count the quiet steps a graph front end ended itself (``ahead``) into the engine,
        before anything reads it; ``drop``: before anything uses it (no more are ended)."""
        self.ahead.settle(self.engine, drop)

    def hands_to_horovod(self, numel, key, messages):
        """Whether this step hands tensor ``key`` of ``numel`` elements to Horovod's own
        allreduce (where its Horovod call can sum it: the front end's part): one batch per step,
        no preconditioner, the decision passes it, and it holds no error-feedback memory to
        carry on any rank (``hvdcomp.feedback.pending``; the step engine carries it), or, for a
        method that steps aside (``hvdcomp.stepaside``), ``messages()``: Horovod may sum its
        message."""
        return (self.driver.one_batch and self.preconditioner.name is None
                and not self.decision.compresses(numel)
                and (messages() if self.engine.aside
                     else not feedback.pending(self.store, key)))

    def sent(self, entry, tensor):
        """What Horovod sums for ``entry`` (``by_horovod``), the gradient ``tensor``: the
        method's message where it steps aside (``message``); where the decision passes every
        tensor in float16 (``Decision.passes_half``) and no loss scale is in force (a scaled
        gradient would overflow float16 where the user's own would not), a float32 gradient in
        float16, as Horovod's ``Compression.fp16`` sends it (``entry.half``; ``decompress``
        returns the sum in the gradient's dtype); else the gradient as it is."""
        if self.engine.aside:
            return self.message(entry, tensor)
        halved = (entry.adapter.halved(tensor) if self.decision.passes_half()
                  and loss_scale.current() == 1.0 else None)
        entry.half = halved is not None
        return tensor if halved is None else halved

    def message(self, entry, tensor):
        """What Horovod sums in place of ``tensor`` (``entry``'s gradient, by Horovod) where the
        method steps aside (``hvdcomp.stepaside``): its message; the new state is held until
        ``stepped`` sees the result."""
        if not self.pending and not self.engine.results:  # a new step: drop an abandoned one's
            self.held.clear()
        work = entry.adapter.working(tensor, "float32")
        sent, self.held[entry.key] = stepaside.message(self.algorithm, work, entry.key,
                                                       self.store, entry.adam is not None)
        return entry.adapter.restore(sent, sent.shape, tensor.dtype, tensor.device)

    def stepped(self, entry, output, fill):
        """``entry``'s step (a tensor like its gradient) from Horovod's reduced message
        ``output`` (``message``), or ``fill`` in every element (a skipped step), or NaN where
        some rank's gradient was not finite (the message's direction need not show it); the
        held state is committed where every rank's gradient was finite, the tensor not absent
        (zero on every rank: a zero step) and the step not skipped; then, under the user's
        Adam, its moments are set so that its update is ``lr`` times the step (as
        ``hvdcomp.preconditioning.ThroughAdam`` lands a step the engine reduced)."""
        new_state = self.held.pop(entry.key)
        reduced = entry.adapter.working(output, "float32")
        if fill is not None or stepaside.absent(reduced, entry.numel):
            return entry.restore(np.full(entry.numel, fill or 0.0, dtype=np.float32))
        if not stepaside.finite(reduced, entry.numel):  # NaN, as Horovod's own sum hands on
            return entry.restore(np.full(entry.numel, np.nan, dtype=np.float32))
        self.store.put(entry.key, new_state)
        self.store.commit()
        step = stepaside.step(self.algorithm, reduced, entry, self.engine.context().size)
        if entry.adam is not None:  # the user's Adam updates by lr * step (ThroughAdam)
            preconditioning.drive_adam(entry.adam, step)
        return entry.restore(step)

    def returns_step(self):
        """The setting whose result is the step itself (``checks.inner_optimizer``), or None:
        the method's (BinSGDM) or the preconditioner's (``precondition='adam'``)."""
        return self.algorithm.returns_step or self.preconditioner.returns_step

    def describe(self):
        """The class and every setting in use (common and the method's): what the ranks must
        agree on (``hvdcomp.checks.agree``)."""
        c, pre = self.compressor, self.preconditioner
        return {"class": type(c).__name__, "min_compress_numel": c.min_compress_numel,
                "on_nonfinite": c.on_nonfinite, "seed": self.algorithm.seed,
                "fusion": self.driver.mode, "fusion_cost": self.driver.cost,
                "precondition": pre.name if pre.adam is None else repr(pre.adam),
                "decision": self.decision.mode, "hierarchy": c.hierarchy_mode,
                **self.algorithm.settings()}

    def state_dict(self, all_ranks):
        """This set's checkpoint (``state.checkpoint``: this rank's, or with ``all_ranks`` every
        rank's of the set, gathered), its process set recorded (``'process_set'``: its world
        ranks, None for every rank)."""
        engine = self.engine
        fields = {"method": self.method, "settings": self.algorithm.settings(),
                  "step": engine.step, "seed": self.algorithm.seed, "skipped": engine.skipped,
                  "decision": self.decision.state(),
                  "process_set": None if self.ranks is None else list(self.ranks)}
        if self.driver.state() is not None:
            fields["fusion"] = self.driver.state()
        return state.checkpoint(engine.context(), fields, self.store, all_ranks)

    def this_ranks(self, checkpoint):
        """``(fields, values)`` of this rank in ``checkpoint`` (what ``state_dict`` returned, or
        a checkpoint of format 1 or 2 without a process set; ``state.this_ranks``: raises where
        it was written by another method, set size or rank)."""
        return state.this_ranks(checkpoint, self.method, self.engine.context())

    def restore(self, mine, values):
        """Restore this rank's checkpoint ``fields`` and per-tensor ``values``
        (``this_ranks``), between steps."""
        self.settle(drop=True)
        self.engine.step, self.algorithm.seed = int(mine["step"]), int(mine["seed"])
        self.engine.skipped = int(mine.get("skipped", 0))
        self.store.load(values)
        self.decision.load(mine.get("decision"))
        self.driver.load(mine.get("fusion"))


class Runtimes:
    """A compressor's runtimes: one per process set it has met (``by_ranks``: world ranks, None
    for every rank -> ``Runtime``) and the one in use (``last``: the runtime of the last tensor
    compressed, or restored)."""

    def __init__(self, compressor):
        self.compressor, self.by_ranks, self.last = compressor, {}, None
        self._last_set = _UNBOUND  # the Horovod process set of the last tensor
        self.unplaced = None  # a runtime restored, before any tensor, without a recorded set

    def for_set(self, process_set):
        """The runtime of a Horovod ``process_set`` (None: the global one), made on first use.
        ``HvdcompError`` where a checkpoint that records no process set was restored before
        the first tensor and this set is another than the one it went to (the global one)."""
        if process_set is self._last_set:
            self.last.settle(drop=True)
            return self.last
        rt = self.of(ownership.process_set_ranks(process_set))
        rt.settle(drop=True)
        if self.unplaced is not None and rt is not self.unplaced:
            raise HvdcompError(
                f"{self.compressor.method}: a checkpoint that records no process set (written "
                "before hvdcomp recorded them) was restored into the global set's state, and "
                f"the first tensor is reduced in the process set of ranks {list(rt.ranks)}: "
                "restore it after the first step in that set, or save it again")
        self.unplaced = None
        self._last_set = process_set
        return rt

    def of(self, ranks, fresh=False):
        """The runtime of the set of world ``ranks``, made on first use (``fresh``: anew, its
        state empty: a new training)."""
        rt = None if fresh else self.by_ranks.get(ranks)
        if rt is None:
            rt = self.by_ranks[ranks] = Runtime(self.compressor, ranks)
        if rt is not self.last:
            self.last, self._last_set = rt, _UNBOUND
        return rt

    def current(self):
        """The runtime in use (the global set's before any tensor), its steps counted
        (``Runtime.settle``)."""
        rt = self.last or self.of(None)
        rt.settle()
        return rt

    def issued(self, ctx):
        """``(runtime, pending, entry)`` of a ``ctx`` that ``compress`` issued: ``pending``,
        whether it waits for its step's flush (LayerFusion: it may be reduced already, and
        pending); ``HvdcompError`` for any other."""
        key = getattr(ctx, "key", None)
        for rt in (self.last, *self.by_ranks.values()):
            pending = None if rt is None else rt.pending.get(key)
            if pending is not None and pending.ticket is ctx:
                return rt, True, pending
            done = None if rt is None else rt.engine.results.get(ctx)
            if done is not None:
                return rt, False, done[1]
        raise HvdcompError(f"{self.compressor.method}: decompress() got a ctx it did not issue")

    def state_dict(self, all_ranks):
        """The compressor's checkpoint: the one set's with state (``Runtime.state_dict``), or
        with several, this rank's of each (``'process_sets'``; ``all_ranks`` refused, which
        each rank decides alone: every rank of a set must have used the same sets)."""
        for rt in self.by_ranks.values():
            rt.settle()
        used = [self.by_ranks[k] for k in sorted(self.by_ranks, key=_set_order)
                if self.by_ranks[k].engine.step or self.by_ranks[k].store.keys()]
        if len(used) <= 1:
            return (used[0] if used else self.current()).state_dict(all_ranks)
        method = self.compressor.method
        if all_ranks:
            raise HvdcompError(
                f"{method}: this compressor serves {len(used)} process sets; "
                "state_dict(all_ranks=True) gathers one set's ranks: save each rank's "
                "state_dict() instead")
        return {"method": method, "format": state.FORMAT,
                "process_sets": [rt.state_dict(False) for rt in used]}

    def load_state_dict(self, checkpoint):
        """Restore each process set's part of ``checkpoint`` into its runtime (a part without a
        recorded set, as every checkpoint before process sets were recorded: the one in use),
        every part checked before any is restored."""
        before_any = self.last is None
        placed = []
        for part in checkpoint.get("process_sets", [checkpoint]):
            ranks = part.get("process_set", _UNBOUND)
            rt = (self.current() if ranks is _UNBOUND
                  else self.of(None if ranks is None else tuple(ranks)))
            if rt.pending:
                raise HvdcompError(
                    f"{self.compressor.method}: load_state_dict() in the middle of a step")
            placed.append((rt, rt.this_ranks(part)))
        for rt, (mine, values) in placed:
            rt.restore(mine, values)
        if before_any and "process_set" not in checkpoint and "process_sets" not in checkpoint:
            self.unplaced = self.last


def _set_order(ranks):
    """Sort key of process sets (world ranks, None: every rank): the global set first."""
    return (ranks is not None, ranks or ())


_UNBOUND = object()
