"""The Horovod ``Compressor`` protocol for methods whose reduction Horovod's sum cannot do.

How a step flows (PyTorch's stock ``hvd.DistributedOptimizer``; the same for ``hvd.allreduce``):

1. ``compress(grad)`` records the gradient under its Horovod name (``hvdcomp.facade.frontends``) and
   returns a 2-element placeholder (``checks.placeholder_values``) that Horovod all-reduces in
   place of the gradient; a small tensor from a torch optimizer it returns as it is, for
   Horovod's own allreduce to sum (``horovod_sums``; for a method that steps aside, its message
   instead, ``hvdcomp.stepaside``; where the decision passes in float16, the tensor in float16,
   ``hvdcomp.facade.runtime.Runtime.sent``).
   No MPI happens here, so it is safe in autograd hooks.
2. The first ``decompress(output, ctx)`` of the step *flushes*: all gradients recorded since the
   last flush are reduced together by the step engine (``hvdcomp.engine``: agree, classify,
   prepare, gather scalars, check, reduce or dense, land), sorted by name, so the order of
   hvdcomp's own collectives is the same on every rank by construction.
3. ``decompress`` returns the mean over ranks, multiplied by the factor the reduced placeholder
   shows (1 for ``op=Average``, size for ``op=Sum``, times any pre/postscale; other ops are
   refused), shaped and typed like the gradient.

The step driver (``hvdcomp.bucketing.StepDriver``) cuts the step into batches: one per step by
default, or with LayerFusion (``fusion='auto'``/``'layerwise'``) buckets reduced by a background
thread while the backward pass runs; errors keep whole-step semantics. Graph front ends
(TensorFlow) call ``reduce_batch_now`` once per step instead, with the step's gradients as one
batch through the same driver (``hvdcomp.facade.graph``, ``hvdcomp.facade.frontends.tensorflow``).

A method (``hvdcomp.methods.contract.Method``) knows none of this: ``compressor_class(Method)`` makes its
Horovod compressor, a ``BatchedCompressor`` that takes the method's own arguments and the common
ones, runs the method through a runtime per process set (``hvdcomp.facade.runtime``: its
state, decision, step engine and driver), and reads the method's settings through
(``hvdcomp.Marsit().compensation``). The class itself can be passed as ``compression=``: its
methods then act on one default instance per class (``Cls.default()``).
"""
import inspect
import logging
import math
import os
import threading


from hvdcomp import bucketing, checks, hierarchical, loss_scale, preconditioning, validate
from hvdcomp.decision import DEFAULT_MODE as DEFAULT_DECISION, MODES as DECISIONS
from hvdcomp.comm import world_rank, world_size
from hvdcomp.facade import ownership
from hvdcomp.facade.graph import GraphCalls
from hvdcomp.facade.runtime import Runtimes
from hvdcomp.errors import HvdcompError, JoinError, UnsupportedOpError
from hvdcomp.facade.frontends import adapter_for

log = logging.getLogger("hvdcomp")
DEFAULT_MIN_COMPRESS_NUMEL = 1024
NONFINITE_CHOICES = ("propagate", "raise", "skip")
# The fusion mode of compressors built without ``fusion=`` (see hvdcomp.bucketing).
DEFAULT_FUSION = os.environ.get("HVDCOMP_FUSION", "step")


class default_instance:
    """Method decorator: called on the class, act on ``cls.default()``; on an instance, as usual.
    The method is also marked so that TensorFlow's AutoGraph runs it as plain Python instead of
    converting it (Horovod calls ``compress``/``decompress`` inside ``tf.function``): the
    attribute ``tf.autograph.experimental.do_not_convert`` sets, without importing TensorFlow."""

    def __init__(self, fn):
        fn.autograph_info__ = frozenset()
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        return self.fn.__get__(cls.default() if obj is None else obj, cls)


class BatchedCompressor(GraphCalls):
    """Base of hvdcomp's compressors (see the module docstring for the protocol).

    Common args (keywords; BinSGDM takes all but ``min_compress_numel`` and ``precondition``,
    and has its own stages): ``on_nonfinite``: what a step with NaN/Inf in some
    rank's gradient does, on every rank alike, the state left unchanged: 'propagate' (default; as
    Horovod's allreduce: NaN for the non-finite tensors, zeros for the others, so AMP's GradScaler
    skips the step and backs off; rank 0 logs them), 'raise' (``NonFiniteGradientError``;
    recommended outside mixed precision) or 'skip' (zeros for every tensor); ``seed`` (int >= 0);
    ``fusion``: 'step' (one batch per step), 'auto' (LayerFusion, ``hvdcomp.bucketing``) or
    'layerwise' (one bucket per tensor), default ``DEFAULT_FUSION``; ``fusion_cost``: optional
    ``(latency s, bandwidth B/s)`` of a bucket's reduction for 'auto'; ``min_compress_numel``:
    tensors with fewer elements are summed uncompressed; ``precondition``: None (default), 'rms',
    or 'adam' / ``hvdcomp.AdamSettings(...)`` (``hvdcomp.preconditioning``); ``decision``:
    'measure' (compress only where it makes the step faster), 'compress' or 'pass'
    (``hvdcomp.decision``), default ``hvdcomp.decision.DEFAULT_MODE``; ``hierarchy``: 'auto' (node
    stages where several nodes have several ranks, ``hvdcomp.hierarchical``) or 'flat'.
    """

    method = "base"  # the method's name (``Method.name``), which errors and checkpoints carry

    def __init__(self, algorithm, *, min_compress_numel=DEFAULT_MIN_COMPRESS_NUMEL,
                 on_nonfinite="propagate", seed=0, fusion=None, fusion_cost=None,
                 precondition=None, decision=None, hierarchy=None):
        self.algorithm = algorithm  # the method as configured; each Runtime runs a copy
        self.min_compress_numel = validate.count("min_compress_numel", min_compress_numel)
        algorithm.seed = validate.count("seed", seed)
        self.on_nonfinite = validate.choice("on_nonfinite", on_nonfinite, NONFINITE_CHOICES)
        self.precondition_setting = precondition
        self._preconditioning = preconditioning.make(precondition, algorithm.under_adam)
        self.fusion_mode = validate.choice(
            "fusion", DEFAULT_FUSION if fusion is None else fusion, bucketing.MODES)
        self.fusion_cost = validate.fusion_cost(self.fusion_mode, fusion_cost)
        self.decision_mode = validate.choice(
            "decision", DEFAULT_DECISION if decision is None else decision, DECISIONS)
        self.hierarchy_mode = hierarchical.checked_mode(hierarchy)
        self._lock = threading.Lock()
        self.runtimes = Runtimes(self)  # one per process set (hvdcomp.facade.runtime)
        # Called per tensor: bound once here, not by default_instance.__get__ at every call.
        self.compress, self.decompress = self.compress, self.decompress

    def _current(self):
        """The runtime in use (the global set's before any tensor)."""
        return self.runtimes.current()

    store = property(lambda self: self._current().store, doc="The runtime's ``StateStore``.")
    engine = property(lambda self: self._current().engine, doc="The runtime's step engine.")
    decision = property(lambda self: self._current().decision,
                        doc="The runtime's compress-or-pass decision (``hvdcomp.decision``).")
    driver = property(lambda self: self._current().driver,
                      doc="The runtime's step driver (``hvdcomp.bucketing.StepDriver``).")
    preconditioner = property(lambda self: self._current().preconditioner,
                              doc="The runtime's preconditioner (``hvdcomp.preconditioning``).")

    # -- the method (hvdcomp.methods.contract.Method) -----------------------------------------
    def settings(self):
        """The method's own settings in use (``Method.settings``)."""
        return self._current().algorithm.settings()

    def __getattr__(self, name):
        """The method's own settings and attributes, read through, from the runtime in use
        (``hvdcomp.Marsit().compensation``; ``seed``, which a checkpoint restores; ``last_legs``:
        {'intra', 'inter'} CommStats of the last batch's node stages)."""
        algorithm = self.__dict__.get("algorithm")
        if algorithm is None or name.startswith("__"):
            raise AttributeError(name)
        runtimes = self.__dict__.get("runtimes")
        return getattr((runtimes and runtimes.last or self).algorithm, name)

    def describe(self):
        """The class and every setting (common and the method's): what the ranks must agree on
        (``hvdcomp.checks.agree``)."""
        return self._current().describe()

    # -- class used bare: one default instance per class -------------------------------------
    @classmethod
    def default(cls):
        """The instance that ``Cls.compress``/``Cls.decompress`` use when the class is passed."""
        if cls.__dict__.get("_default") is None:
            cls._default = cls()
        return cls._default

    # -- the Horovod Compressor protocol ------------------------------------------------------
    @default_instance
    def compress(self, tensor):
        """Record ``tensor`` for this step's batch in its process set's runtime; return
        (placeholder, or the tensor itself where Horovod sums it (``horovod_sums``; a method
        that steps aside: its message), ctx)."""
        adapter = adapter_for(tensor)
        ident = adapter.tensor_identity(tensor, self.method)  # or UnnamedTensorError
        with self._lock:
            rt = self.runtimes.for_set(ident.process_set)
            verdict = rt.ownership.claim(ident.name, ident.owner, bool(rt.pending))
            if verdict == ownership.FRESH:
                log.info("%s: a new training (its parameters replace gone ones): starting "
                         "with fresh state", self.method)
                rt = self.runtimes.of(rt.ranks, fresh=True)
                rt.ownership.claim(ident.name, ident.owner, False)
            elif verdict == ownership.FORGET:
                rt.engine.forget(ident.name)
            rt.ownership.check_parameters(rt.engine.context, adapter, ident.optimizer)
            if rt.ownership.one_off(ident, adapter):
                return tensor, None  # Horovod sums it as it is (Compression.none)
            if getattr(adapter, "DEFERRED", False):
                # Graph front ends (TensorFlow) trace this once; decompress() builds the step,
                # and what Horovod sums is chosen at each step (Deferred.sent).
                ctx = adapter.Deferred(self, ident, tensor)
                return ctx.sent(_placeholder(adapter, tensor)), ctx
            key = ident.name
            if key in rt.pending:
                raise _compressed_twice(self, key)
            entry = rt.engine.entry(key, tensor, adapter,
                                    horovod_sums(rt, tensor, adapter, ident), ident)
            sent = rt.sent(entry, tensor) if entry.by_horovod else _placeholder(adapter, tensor)
            rt.pending[key] = entry
            rt.driver.arrived(entry)
        return sent, entry.ticket

    @default_instance
    def decompress(self, output, ctx):
        """The reduced gradient for ``ctx`` (flushing the batch on the first call of a step).
        The reduction op is checked first: an unsupported one abandons the step (nothing
        communicated, state unchanged) and raises ``UnsupportedOpError``."""
        if getattr(ctx, "DEFERRED", False):
            return ctx.build(output)
        if ctx is None:  # Horovod's own mean: a one-off direct value (Ownership.one_off), or a
            return output  # sparse gradient horovod.torch reduced without calling compress()
        with self._lock:
            rt, pending, entry = self.runtimes.issued(ctx)
            try:  # Horovod applied the (mean or sum) op of an entry by_horovod itself
                factor = 1 if entry.by_horovod else self.op_factor(
                    entry.adapter.reduced(output), ctx.key, rt.ranks)
            except UnsupportedOpError:
                self._refuse_op(rt)
                raise
            if pending:
                entries, rt.pending = list(rt.pending.values()), {}
                rt.driver.finish_step(entries)
            flat, entry = rt.engine.take(ctx)
        if entry.by_horovod:  # Horovod's result; a skipped step fills it
            if rt.engine.aside:  # a message (hvdcomp.stepaside)
                with self._lock:
                    return rt.stepped(entry, output, flat.fill)
            if entry.half:
                output = entry.adapter.as_dtype(output, entry.dtype)
            return output if flat.fill is None else output.fill_(flat.fill)
        return entry.restore(flat, factor)

    def op_factor(self, values, key, ranks=None):
        """The factor of Horovod's op for tensor ``key`` (1 for Average, the set's size for Sum,
        times pre/postscale) from its reduced placeholder's ``values`` (``adapter.reduced()``;
        one value: unreduced, 1), over the process set of world ``ranks`` (None: every rank);
        ``UnsupportedOpError`` for any other op."""
        return checks.reduction_factor(values, ranks or range(world_size()), key, self.method,
                                       world_rank())

    def _refuse_op(self, rt):
        """Before ``UnsupportedOpError``: drop the step under way in runtime ``rt`` (state
        unchanged); raise ``LaunchError`` for a launch without MPI ranks, ``JoinError`` where a
        rank in hvd.join() explains the placeholder (``checks.confirm_op_refusal``, or
        LayerFusion's worker)."""
        entries, rt.pending = list(rt.pending.values()), {}
        found = rt.driver.abandon(entries)
        if isinstance(found, JoinError):
            raise found from None
        checks.confirm_op_refusal(rt.engine.context())

    # -- checkpoints ---------------------------------------------------------------------------
    @default_instance
    def state_dict(self, all_ranks=False):
        """This rank's state (format 2, ``hvdcomp.state``), or with ``all_ranks=True`` every
        rank's, gathered on every rank (a collective: call it on all ranks; rank 0 can then
        save one file that restores every rank). A compressor used in several process sets
        saves each set's (``'process_sets'``), this rank's only."""
        with self._lock:
            return self.runtimes.state_dict(all_ranks)

    @default_instance
    def load_state_dict(self, checkpoint):
        """Restore what ``state_dict()`` returned (this rank's, or the all-ranks form; formats 1
        and 2), each process set's into its runtime (one without a recorded set: the runtime
        in use, the global set's before any tensor)."""
        with self._lock:
            self.runtimes.load_state_dict(checkpoint)

    # -- what a step did, and LayerFusion ------------------------------------------------------
    last_stats = property(lambda self: self._current().engine.last_stats,
                          doc="``StepStats`` of the last step (None before the first).")
    total_stats = property(lambda self: self._current().engine.total_stats,
                           doc="``StepStats`` summed over every step so far.")

    precondition = property(lambda self: self._preconditioning.name,
                            doc="None, 'rms' or 'adam'.")
    adam = property(lambda self: self._preconditioning.adam,
                    doc="The ``AdamSettings`` of precondition='adam', else None.")

    @property
    def fusion_plan(self):
        """The LayerFusion plan in use (``StepDriver.plan_dict``), or None."""
        return self._current().driver.plan_dict()

    @default_instance
    def describe_fusion(self):
        """One line describing the buckets in use (on a bare class: its default instance's)."""
        return f"{self.method}: {self._current().driver.describe()}"


def compressor_class(method_cls):
    """The Horovod compressor class of a ``Method`` subclass: named as the method (its docstring
    too), built with the method's own arguments and the common ones (``BatchedCompressor``).
    Common settings the method refuses raise TypeError; those it fixes are set."""
    common = set(inspect.signature(BatchedCompressor.__init__).parameters) - {"self", "algorithm"}

    def __init__(self, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in common}
        refused = sorted(given.keys() & set(method_cls.refused))
        if refused:
            raise TypeError(f"{method_cls.name} takes no {', '.join(refused)}: "
                            f"{method_cls.refusal}")
        BatchedCompressor.__init__(self, method_cls(*args, **kwargs),
                                   **{**given, **method_cls.fixed})

    return type(method_cls.__name__, (BatchedCompressor,),
                {"__init__": __init__, "__doc__": method_cls.__doc__, "method": method_cls.name,
                 "Method": method_cls, "__module__": "hvdcomp",
                 "__qualname__": method_cls.__name__})


def _compressed_twice(compressor, key):
    """The error for a tensor ``key`` that ``compressor`` records twice in one step."""
    return HvdcompError(
        f"{compressor.method}: tensor {key!r} was compressed twice before decompress(). If "
        "several optimizers share a compressor, give each its own instance, e.g. "
        f"compression=hvdcomp.{type(compressor).__name__}().")


def horovod_sums(runtime, tensor, adapter, ident):
    """Whether Horovod's own allreduce reduces ``tensor`` itself (``Entry.by_horovod``; its
    ``compress`` then hands Horovod the tensor as ``hvd.Compression.none`` does): one that a
    compressor's ``runtime`` hands to Horovod this step (``Runtime.hands_to_horovod``: passed by
    the decision, or, for a method that steps aside, its message, where Horovod may sum it,
    ``_message_summable``) and whose Horovod call reduces by mean or sum
    (``adapter.horovod_may_sum``: torch optimizers). A model of many small tensors then costs a
    step about what Horovod's uncompressed allreduce costs (no placeholder, copy or second
    collective), and hvdcomp still holds each tensor to the batch's agreement and finiteness
    verdict."""
    return (runtime.hands_to_horovod(math.prod(tensor.shape), ident.name,
                                     _message_summable)
            and getattr(adapter, "horovod_may_sum", None) is not None
            and adapter.horovod_may_sum(tensor, ident))


def _message_summable():
    """Whether Horovod's allreduce may sum the message of a method that steps aside
    (``hvdcomp.stepaside``): a gradient not scaled for mixed precision (the state is kept of
    unscaled gradients, ``hvdcomp.loss_scale``). Under the user's Adam the moments are set as
    the message's step is handed back (``Runtime.stepped``)."""
    return loss_scale.current() == 1.0


def _placeholder(adapter, tensor):
    """What Horovod all-reduces in place of ``tensor`` (``checks.placeholder_values``)."""
    return adapter.placeholder(tensor, checks.placeholder_values(world_rank()))
