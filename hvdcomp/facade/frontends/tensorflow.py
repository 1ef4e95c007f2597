"""TensorFlow adapter (eager, tf.function and Keras).

Horovod's TensorFlow integration calls ``compress``/``decompress`` while tracing (the
DistributedGradientTape and DistributedOptimizer always trace their all-reduce, even in eager
mode), so Python there runs once per trace, not once per step. This adapter therefore defers the
work: ``compress`` returns a 2-element float32 placeholder for Horovod's allreduce, and
``decompress`` returns ``tf.numpy_function`` ops that, at every step, hand the gradients' values
to the compressor's ``reduce_batch_now`` (the shared NumPy backend: no second implementation).

One batch per step (``StepBatch``): the gradients of one ``allreduce_grads`` call (every gradient
path of Horovod TF: DistributedGradientTape, the legacy and the Keras DistributedOptimizer, with
or without ``num_groups``/``groups``) are reduced together by one op, built in the gradients' own
graph when the first of them is decompressed: hvdcomp pays the ring's latency once per step, not
once per tensor, and the compressor counts one step per training step. Each gradient's own op,
inside Horovod's ``tf.cond``, takes the batch op's output as an input (so runs after it) and
returns its result. A gradient that the compress-or-pass decision passes is handed to Horovod's
own allreduce instead of the placeholder (``StepBatch.plan_op``), which sums it during the
backward pass, as ``hvd.Compression.none`` does; the batch op only checks it. Direct
``hvd.allreduce(t, name=...)`` calls are reduced one by one.

Ordering: the batch ops and the direct calls' ops are stateful, and ``tf.function`` runs
stateful ops in program order (automatic control dependencies), so hvdcomp's collectives run in
trace order, the same on every rank. TF1-style graphs run by ``tf.compat.v1.Session`` (no
automatic control dependencies) are not supported.

Naming (``callers()``, ``hvdcomp.facade.frontends.naming``): state is keyed by the variable's
name (read from Horovod's ``allreduce_grads`` frame), so a retrace (new input shape) finds the same state;
direct calls need ``name=``.
"""
import collections
import functools
import math
import os
import sys
import weakref
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from hvdcomp import checks, loss_scale, preconditioning
from hvdcomp.engine import SUMMED, HorovodSum
from hvdcomp.errors import UnsupportedTensorError
from hvdcomp.facade.frontends.identity import Identity
from hvdcomp.facade.frontends import numpy as np_adapter
from hvdcomp.facade.frontends.naming import Caller, group_member, locate, position, unnamed

DEFERRED = True


# How far above tensor_identity()'s caller the Horovod call may be (compress() and any wrapper
# of it, AutoGraph's converted_call and if/else bodies in between: 10-14 frames measured), how
# far above that call allreduce_grads (tf.cond's branch tracing in between: 23 measured), the
# tape/optimizer object (2, Keras 12) and hvd.keras.allreduce (1) may be. A frame is claimed only
# when it holds the tensor itself, so generous bounds cannot misname.
CALL_FRAMES, GRADS_FRAMES, OPTIMIZER_FRAMES, KERAS_FRAMES = 40, 64, 40, 4
_CALLERS = None


def _in(module, name):
    """A ``matches`` predicate: the frame runs function ``name`` of ``module``, as written or
    as AutoGraph's conversion (``tf__<name>``, which keeps the module's globals)."""
    names = (name, "tf__" + name)
    return lambda frame: frame.f_globals is module.__dict__ and frame.f_code.co_name in names


def callers():
    """The table of horovod.tensorflow (0.28.1) functions that call ``compress()`` or stand
    above such a call, and the locals each row reads (``hvdcomp.facade.frontends.naming``);
    looked up in this order (``tensor_identity``):

    1. the call itself, ``allreduce`` or ``grouped_allreduce``, holding the tensor;
    2. above it, ``allreduce_grads(grads, vars)``: every gradient path (DistributedGradientTape,
       the legacy and the Keras DistributedOptimizer; default, ``num_groups`` and ``groups``)
       calls (1) inside a ``tf.cond`` from there; the tensor is ``grads[i]``, named ``vars[i]``;
    3. otherwise the call's ``name=``, or, without one, hvd.keras.allreduce's ``name`` when that
       is the caller.
    """
    global _CALLERS
    if _CALLERS is None:
        try:
            import horovod._keras as hvd_keras
            import horovod.tensorflow as hvd
        except ImportError:  # no Horovod: nothing can name a tensor
            return ()
        from hvdcomp.facade import horovod_version
        horovod_version.check_installed()
        _CALLERS = (
            Caller("horovod.tensorflow.allreduce (hvd.allreduce)",
                   "tensor, name (None: unnamed), process_set", _in(hvd, "allreduce"), _direct),
            Caller("horovod.tensorflow.grouped_allreduce (hvd.grouped_allreduce)",
                   "tensors, name (member i is named '<name>_<i+1>of<n>', as Horovod names it), "
                   "process_set", _in(hvd, "grouped_allreduce"), _direct_group),
            Caller("horovod.tensorflow._make_cached_allreduce_grads_fn.<locals>.allreduce_grads",
                   "grads (the tensor is grads[i]), vars (vars[i].name, '#i' appended when "
                   "several variables share it), process_set; the optimizer: the nearest 'self' "
                   "above with _allreduce_grads (the tape or optimizer)",
                   _in(hvd, "allreduce_grads"), _gradients),
            Caller("horovod._keras.allreduce (hvd.keras.allreduce)",
                   "name (it names the constant that hvd.allreduce gets)",
                   _in(hvd_keras, "allreduce"), _keras_direct),
        )
    return _CALLERS


def _collective_op(loc):
    """The op that Horovod's ``allreduce``/``grouped_allreduce`` (locals ``loc``) applies in its
    collective, or None where it averages in the framework after it (ROCm builds; ``is True``:
    in AutoGraph's conversion of ``allreduce`` the flag is an ``Undefined`` object until set)."""
    return None if loc.get("average_in_framework") is True else loc.get("op")


def _direct(frame, tensor):
    loc = frame.f_locals
    if loc.get("tensor") is not tensor:
        return None
    return Identity(loc.get("name"), None, loc.get("process_set"), None,
                    horovod_op=_collective_op(loc))


def _direct_group(frame, tensor):
    loc = frame.f_locals
    tensors, name = loc.get("tensors") or (), loc.get("name")
    index = position(tensors, tensor)
    if index is None:
        return None
    name = None if name is None else group_member(name, index, len(tensors))
    return Identity(name, None, loc.get("process_set"), None, horovod_op=_collective_op(loc))


class GradientsCall(NamedTuple):
    """One ``allreduce_grads(grads, vars)`` call of Horovod TF, as ``compress`` sees it."""
    grads: Any
    vars: Any


def gradient_names(vars_):
    """The key of each gradient of ``allreduce_grads(grads, vars_)``: ``vars_[i].name``, with
    ``'#i'`` appended when several variables share it (e.g. two standalone layers'
    'kernel:0')."""
    names = [v.name for v in vars_]
    counts = collections.Counter(names)
    return [f"{n}#{i}" if counts[n] > 1 else n for i, n in enumerate(names)]


def _gradients(frame, tensor):
    loc = frame.f_locals
    grads, vars_ = loc.get("grads"), loc.get("vars")
    index = position(grads or (), tensor)
    if index is None or not isinstance(vars_, (list, tuple)) or index >= len(vars_):
        return None
    name = vars_[index].name
    if sum(v.name == name for v in vars_) > 1:
        name = gradient_names(vars_)[index]
    return Identity(name, vars_[index], loc.get("process_set"), _optimizer(frame.f_back),
                    GradientsCall(grads, vars_))


def _keras_direct(frame, tensor):
    name = frame.f_locals.get("name")
    return Identity(name, None, None, None) if isinstance(name, str) else None


def _optimizer(frame):
    """The DistributedGradientTape / DistributedOptimizer above ``allreduce_grads``: the nearest
    ``self`` with Horovod's ``_allreduce_grads`` (not the gradient-aggregation helper of
    ``backward_passes_per_step``), or None."""
    for _ in range(OPTIMIZER_FRAMES):
        if frame is None:
            return None
        obj = frame.f_locals.get("self")
        if getattr(obj, "_allreduce_grads", None) is not None \
                and "gradient_aggregation" not in type(obj).__module__:
            return obj
        frame = frame.f_back
    return None


@tf.autograph.experimental.do_not_convert
def tensor_identity(tensor, method):
    """The ``Identity`` of ``tensor`` for compressor ``method``'s ``compress()``: the variable's
    name for the gradients of DistributedGradientTape / DistributedOptimizer, else the
    ``name=`` of hvd.allreduce (``callers()``); ``UnnamedTensorError`` otherwise.

    Graph tensors (inside tf.function) get no name of their own: ``mul:0`` is stable across
    ranks only while every rank traces the same program, repeats across tf.functions (two
    functions each have an ``add:0``, whose states would mix) and shifts when a retrace adds
    ops; they are named like eager ones, by ``name=``."""
    table = callers()
    hit = locate(tensor, table[:2], sys._getframe(1), CALL_FRAMES) if table else None
    identity = None
    if hit is not None:
        frame, identity = hit
        above = locate(tensor, table[2:3], frame.f_back, GRADS_FRAMES)
        if above is not None:
            identity = above[1]._replace(horovod_op=identity.horovod_op)
        elif identity.name is None:
            keras = locate(tensor, table[3:], frame.f_back, KERAS_FRAMES)
            identity = keras and keras[1]
    if identity is None or not isinstance(identity.name, str):
        shape = tensor.shape.as_list() if tensor.shape.rank is not None else ["unknown"]
        raise unnamed(method, shape, tensor.dtype.name)
    return identity


def parameter_names(optimizer):
    """None: a TensorFlow tape or optimizer learns its variables only when gradients are
    reduced, so there is no list to agree on beforehand (each step's batch agreement compares
    the tensors)."""
    return None


_KERAS_BASES = ("Optimizer", "OptimizerV2", "_BaseOptimizer")


def _keras_class(optimizer):
    """The user's Keras optimizer class that ``optimizer`` is (or Horovod's subclass of), or
    None where it is none of Keras's (e.g. a DistributedGradientTape)."""
    return next((c for c in type(optimizer).__mro__
                 if c.__module__.split(".")[0] in ("keras", "tf_keras")), None)


def optimizer_kind(optimizer):
    """None where ``optimizer`` (Horovod's Keras ``DistributedOptimizer``, a subclass of the
    user's Keras optimizer class) is plain SGD without momentum, or not a Keras optimizer hvdcomp
    can tell (e.g. a DistributedGradientTape, which has no optimizer); else its description,
    e.g. ``'tf.keras.optimizers.Adam'`` or ``'tf.keras.optimizers.SGD with momentum=0.9'``
    (``hvdcomp.checks.inner_optimizer``)."""
    base = _keras_class(optimizer)
    if base is None or base.__name__ in _KERAS_BASES:
        return None
    name = f"tf.keras.optimizers.{base.__name__}"
    if base.__name__ != "SGD":
        return name
    momentum = sgd_momentum(optimizer)
    if not momentum:
        return None
    given = isinstance(getattr(optimizer, "momentum", None), (int, float))  # legacy: a flag
    return f"{name} with momentum={momentum:g}" if given else f"{name} with momentum"


def sgd_momentum(optimizer):
    """The momentum of a Keras ``SGD`` (0.9 for a legacy one that only flags it), or 0.0 for any
    other optimizer."""
    base = _keras_class(optimizer)
    if base is None or base.__name__ != "SGD":
        return 0.0
    momentum = getattr(optimizer, "momentum", None)
    if isinstance(momentum, (int, float)):
        return float(momentum)
    return 0.9 if getattr(optimizer, "_momentum", False) else 0.0


def keras_adam(optimizer):
    """``optimizer`` where it is (Horovod's subclass of) the user's Keras ``Adam``/``AdamW``
    whose first moment hvdcomp can drive (``hvdcomp.preconditioning.FollowAdam``): a Keras 2
    optimizer (not legacy), without amsgrad, ``beta_1`` a number; else None."""
    base = _keras_class(optimizer)
    if base is None or base.__name__ not in ("Adam", "AdamW") or ".legacy." in base.__module__:
        return None
    betas = (getattr(optimizer, "beta_1", None), getattr(optimizer, "beta_2", None))
    if getattr(optimizer, "amsgrad", False) or not all(isinstance(b, (int, float)) for b in betas):
        return None
    return optimizer


def driven_adam(optimizer, preconditioner):
    """The user's Keras Adam whose moments ``preconditioner`` drives (``keras_adam``), or None."""
    drives = isinstance(preconditioner, (preconditioning.FollowAdam, preconditioning.ThroughAdam))
    return keras_adam(optimizer) if drives else None


def clip_as_keras(optimizer, moments):
    """Keras's own clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``, as its
    ``_clip_gradients`` applies them) of the momenta that land as Adam's first moment
    (``KerasAdamMoments.landed``): Keras clips them again as the gradients it receives, so its
    update keeps the clipped momentum as its first moment, ``m / sqrt(v)`` of what it
    received, as PyTorch's ``AdamMoments.follow_gradient`` does. ``global_clipnorm``'s norm is
    taken over these momenta (the tensors hvdcomp compresses; the few small ones summed exactly
    are left out of it). Not where the second moment is set too (``ThroughAdam``, whose update is
    the step itself, within Adam's bound whatever Keras clips)."""
    landed = [m.landed for m in moments
              if m is not None and m.landed is not None and m.landed_v is None]
    clipnorm, global_clipnorm, clipvalue = (getattr(optimizer, k, None) for k in
                                            ("clipnorm", "global_clipnorm", "clipvalue"))
    if not landed or not (clipnorm or global_clipnorm or clipvalue):
        return
    if clipnorm and clipnorm > 0:
        for m in landed:
            m *= clipnorm / max(float(np.linalg.norm(m)), clipnorm)
    elif global_clipnorm and global_clipnorm > 0:
        norm = math.sqrt(sum(float(np.dot(m, m)) for m in landed))
        for m in landed:
            m *= global_clipnorm / max(norm, global_clipnorm)
    elif clipvalue and clipvalue > 0:
        for m in landed:
            np.clip(m, -clipvalue, clipvalue, out=m)


def drivable_adam(optimizer):
    """Whether ``optimizer`` is a Keras Adam/AdamW whose moments hvdcomp can set
    (``keras_adam``, with ``beta_2 > 0``: ``hvdcomp.preconditioning.ThroughAdam``)."""
    return keras_adam(optimizer) is not None and optimizer.beta_2 > 0


def build_untraced(optimizer, variables):
    """``optimizer.build(variables)`` (a Keras optimizer's slots, as its ``apply_gradients``
    builds them) in the eager context, its variables made as eager variables that the
    ``tf.function`` being traced does not see. A ``tf.function`` that creates variables in its
    first trace traces itself a second time (TensorFlow's rule for variables made on the first
    call), and the step op is built in the trace of Horovod's allreduce function (a
    ``tf.function`` inside Keras's train function): built there, the slots cost that function a
    second trace (recipe (d) under cProfile: 4.7 s for its two traces, 3.5 s for its one under
    Horovod's own compression). Where Keras builds them, after the allreduce function, only
    its own train function retraces, as it does anyway. Under a ``tf.distribute`` strategy,
    whose variable creators place the variables, the build goes through them as Keras's
    would."""
    with tf.init_scope():
        if getattr(optimizer, "_built", False) or tf.distribute.has_strategy():
            optimizer.build(variables)
            return
        with eager_variables():
            optimizer.build(variables)


def eager_variables():
    """A ``tf.variable_creator_scope`` (inside ``tf.init_scope()``) whose variables are made
    as plain eager variables, past any other creator, which the function being traced does not
    see as its own (it would trace itself again for them)."""
    from tensorflow.python.ops import resource_variable_ops

    def eager_variable(next_creator, **kwargs):  # the bottom of the creator chain
        return resource_variable_ops.default_variable_creator_v2(None, **kwargs)
    return tf.variable_creator_scope(eager_variable)


class Countdown:
    """The quiet steps a ``StepBatch``'s graph may end itself, without its plan op's Python call
    (the countdown of ``hvdcomp.engine.QuietGrant``): an int64 variable, eager
    (``eager_variables``), on the host (where the ``tf.cond`` reads its predicate), that
    ``start`` sets and each step so ended decrements (``ends``)."""

    def __init__(self):
        with tf.init_scope(), eager_variables(), tf.device("CPU:0"):
            self.left_var = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="hvdcomp_quiet_steps")

    def start(self, steps):
        with tf.init_scope():  # at trace time too, e.g. from compress()
            self.left_var.assign(steps)

    def left(self):
        with tf.init_scope():
            return int(self.left_var.numpy())

    def ends(self, keys, planned):
        """In the graph, the plan and flags of a step (``StepBatch.plan_op``): on a step the
        countdown ends (it counts it), all ``keys`` passed, quiet and silent; else ``planned()``
        (a ``tf.cond``: the plan op's branch holds a stateful op)."""
        def granted():
            with tf.control_dependencies([self.left_var.assign_sub(1)]):
                return tf.ones([keys], tf.bool), tf.ones([2], tf.bool)
        return tf.cond(self.left_var.read_value() > 0, granted, planned)


class KerasAdamMoments:
    """One variable's Keras Adam moments as ``FollowAdam`` and ``ThroughAdam`` read and drive
    them, for one step: its first and second moments ``m``, ``v`` (None where only the first is
    driven: ``FollowAdam``) and the optimizer's step count,
    read in the graph before the step's reduction; ``momentum()`` and ``second()`` are what the
    graph assigns to the moments after it (what landed, else the values read), ordered before
    Keras's own update reads them. Keras's update then keeps a landed first moment
    (``m + (M - m)(1 - b1) = M`` with ``m = M``)."""
    __slots__ = ("m", "v", "beta1", "beta2", "step", "landed", "landed_v")

    def __init__(self, m, v, betas, step):
        self.m, self.v, self.step = m, v, int(step)
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.landed = self.landed_v = None

    @classmethod
    def read(cls, values, moments, n, betas):
        """Per gradient of a batch of ``n``, its moments (None where not driven), from the
        step op's inputs ``values``: the moments of ``moments`` ((index, m, v or None) each, in
        order: m, then v where driven), then Adam's step count."""
        adam, read = [None] * n, iter(values[:-1])
        for i, _, v in moments:
            m = next(read).reshape(-1)
            adam[i] = cls(m, None if v is None else next(read).reshape(-1), betas, values[-1])
        return adam

    def steps(self):
        return self.step

    def started(self):
        return True  # Keras builds its moments (zeros) before the first step

    def exp_avg(self, like):
        return self.m

    def set_exp_avg(self, momentum):
        self.landed = np.array(momentum, dtype=np.float32).reshape(-1)

    def set_exp_avg_sq(self, second):
        self.landed_v = np.array(second, dtype=np.float32).reshape(-1)

    def momentum(self):
        return self.m if self.landed is None else self.landed

    def second(self):
        return self.v if self.landed_v is None else self.landed_v


def placeholder(tensor, values):
    """``values`` (``hvdcomp.checks.placeholder_values``) as the float32 tensor Horovod
    all-reduces in place of the gradient."""
    return tf.constant(values, dtype=tf.float32)


def _batchable(grad):
    """Whether Horovod hands ``grad`` of an ``allreduce_grads`` call to ``compress``, and hvdcomp
    reduces it in the call's batch: a dense floating tensor of a traced function (None and
    IndexedSlices gradients are Horovod's own)."""
    return tf.is_symbolic_tensor(grad) and grad.dtype.is_floating


def _summable(grad):
    """Whether Horovod's own allreduce may sum ``grad`` as hvdcomp would (``StepBatch.passable``,
    given an Average or Sum op): a float32 gradient of a static shape."""
    return grad.dtype == tf.float32 and grad.shape.num_elements() is not None


def _results_since(graph, start):
    """A small tensor of ``graph`` (one element of each) that is ready once every result of the
    conds in ``graph`` from its ``start``-th op on is: Horovod's ``_allreduce_cond`` around each
    gradient of a call traced so far (hvdcomp's own conds too). The take of
    ``StepBatch.closing`` reads it, so it runs after every other gradient's Horovod sum
    (TensorFlow's executor runs a weight gradient's op whenever its inputs are ready, so no one
    sum is known to come last; a control dependency on another cond's tensors is dropped: they
    are not in the closing gradient's branch). One element each: on a GPU only those reach
    ``take``'s host memory."""
    with graph.as_default():
        ready = [tf.cast(tf.reshape(out, [-1])[:1], tf.float32)
                 for op in graph.get_operations()[start:] if op.type in ("If", "StatelessIf")
                 for out in op.outputs if out.dtype.is_numeric or out.dtype == tf.bool]
        return tf.concat(ready, 0) if ready else tf.zeros([0])


def _horovod_reduces(process_set):
    """The predicate of Horovod's ``_allreduce_cond`` around each gradient: this rank is in
    ``process_set`` (None: the global set), of 2+ ranks; a Python bool, or a boolean tensor with
    HOROVOD_ELASTIC=1 (where Horovod computes it at run time too)."""
    import horovod.tensorflow as hvd
    from horovod.tensorflow.mpi_ops import process_set_included_op, size_op
    process_set = process_set or hvd.global_process_set
    if int(os.environ.get("HOROVOD_ELASTIC", 0)):
        return tf.logical_and(tf.equal(process_set_included_op(process_set.process_set_id), 1),
                              tf.greater(size_op(process_set.process_set_id), 1))
    return process_set.included() and process_set.size() > 1


def _working(tensor):
    return tf.cast(tensor, tf.float64 if tensor.dtype == tf.float64 else tf.float32)


def keras_loss_scale_optimizer(frame, depth=400):
    """The Keras ``LossScaleOptimizer`` (mixed precision) whose ``compute_gradients`` traces the
    step that ``frame`` is in, or None. It multiplies the loss by its loss scale, Horovod's
    optimizer inside it reduces the scaled gradients, and it divides them afterwards; hvdcomp
    reduces them in unscaled units (``hvdcomp.loss_scale``), so that its state and the user's
    Adam moments it drives keep one scale."""
    while frame is not None and depth:
        owner = frame.f_locals.get("self")
        if type(owner).__name__.startswith("LossScaleOptimizer") and hasattr(owner, "loss_scale"):
            return owner
        frame, depth = frame.f_back, depth - 1
    return None


def scale_of(scaler):
    """The step's loss scale as a float32 tensor: ``scaler``'s (``keras_loss_scale_optimizer``),
    or 1."""
    if scaler is None:
        return tf.constant(1.0, tf.float32)
    return tf.cast(scaler.loss_scale, tf.float32)


class StepPlan:
    """The plan op of a ``StepBatch``: run first in each step, it says per key whether Horovod's
    own allreduce sums that gradient this step (``BatchedCompressor.horovod_plan``), and whether
    the step is ``quiet`` (ended at once: the step op does not run) and ``silent`` (no result
    is handed over)."""

    def plan_op(self):
        """The step's plan (a bool per key: Horovod sums that gradient), built at the first
        call, in ``graph``, where the step op is; False for every key where Horovod's conds do
        not take their allreduce branch. Beside it, ``flags``. A step that ``countdown`` ends
        passes every key, quiet and silent, without the Python call."""
        if self._plan is None:
            with self.graph.as_default():
                def planned():
                    return tuple(tf.numpy_function(
                        self._planned, [], [tf.bool, tf.bool], stateful=True,
                        name=f"hvdcomp_{self.compressor.method}_plan"))
                plan = functools.partial(self.countdown.ends, len(self.keys), planned)

                def none():
                    return tf.zeros([len(self.keys)], tf.bool), tf.zeros([2], tf.bool)
                here = _horovod_reduces(self.process_set)
                self._plan, self._flags = (tf.cond(here, plan, none) if tf.is_tensor(here)
                                           else plan() if here else none())
                self._plan.set_shape([len(self.keys)])
                self._flags.set_shape([2])
        return self._plan

    def quiet(self):
        """The plan op's flag: this step is quiet (``hvdcomp.engine.pass_planned``: every
        gradient passed, the step already ended), so the step op does not run."""
        self.plan_op()
        return self._flags[0]

    def silent(self):
        """The plan op's flag: this step is quiet and its exchange window is not read, so no
        result of it is handed over (``hands_over``'s sum too is returned in graph ops)."""
        self.plan_op()
        return self._flags[1]

    def _planned(self):
        """The plan and ``[quiet, silent]`` (``plan_op``); the step's exchange window starts
        here (``horovod_plan``). A quiet step's results are Horovod's sums, set here for the
        ``take`` that hands one over where its window is read."""
        keys = [k for k, s in zip(self.keys, self.sums) if s]
        numels = [self.tensors[k].shape.num_elements() for k in keys]
        summed, quiet, silent, _ = self.compressor.horovod_plan(
            numels, keys, self.process_set, whole=len(keys) == len(self.keys),
            countdown=self.countdown)
        if quiet:
            self.results = dict.fromkeys(self.keys, SUMMED)
        summed = dict(zip(keys, summed))
        return (np.array([summed.get(k, False) for k in self.keys], dtype=np.bool_),
                np.array([quiet, silent], dtype=np.bool_))


class StepBatch(StepPlan):
    """The gradients of one traced ``allreduce_grads`` call (``GradientsCall``), reduced at
    every step as one batch by one op, but for those that Horovod's own allreduce sums.

    ``keys``: the call's gradients that Horovod hands to ``compress`` (``_batchable``), in call
    order; ``tensors``: key -> gradient (a tensor of the traced function). ``step_op()``: the op
    that reduces them all (``reduce_batch_now``), built once, in ``graph``, the graph in which
    ``allreduce_grads`` runs, i.e. outside Horovod's per-tensor ``tf.cond`` branches; every
    gradient's ``decompress`` builds a ``take`` op that has the step op as an input (so it runs
    after it, by data dependency) and returns the gradient's result, times the op factor its own
    reduced placeholder shows. The take ops are stateless, so Horovod's tf.cond around each
    placeholder stays stateless and TensorFlow runs the placeholders' allreduces together, as
    without hvdcomp (a stateful op in each cond would run them one Horovod cycle apart).

    What Horovod sums: ``plan_op()``, built once beside the step op and run first in each step,
    says per key whether the step hands that gradient to Horovod's allreduce itself
    (``BatchedCompressor.horovod_plan``: the decision passes it; ``passable``: a float32
    gradient of a static shape whose call averages or sums in its collective). Its ``compress``
    output (``Deferred.sent``) is then the gradient, flat, or the placeholder, as the plan says
    (``select``: dataflow ops, not a ``tf.cond``, whose branch functions would cost its trace
    several times as much). So a passed gradient is summed by Horovod as soon as the backward
    pass has computed it, overlapping the rest of it, as under ``hvd.Compression.none``; the step op
    still holds it to the batch's agreement and finiteness verdict (``Entry.by_horovod``), and
    ``decompress`` returns Horovod's sum (a skipped step: ``take``'s fill), the last one traced
    through ``take`` after every other (``hands_over``), the others in graph ops (``switch``).
    On a quiet step (``hvdcomp.engine.QuietSteps``: every gradient passed, no agreement due),
    which the plan op ends at once (``quiet``), the step op does not run; the closing take runs
    only where the next step reads the window (``silent``). A quiet step then costs one Python op,
    the plan's, at its start, and a quiet and silent one that the last plan granted ahead
    (``Countdown``, ``hvdcomp.engine.QuietGrant``) a few graph ops."""

    def __init__(self, compressor, call, process_set, optimizer=None):
        # hvdcomp's world communicator is created by every rank together: here, at trace time,
        # where every rank is (the step op may run on a process set's ranks only).
        checks.context(compressor.method)
        self.compressor, self.call, self.process_set = compressor, call, process_set
        runtime = compressor.runtimes.for_set(process_set)  # hvdcomp.facade.runtime
        self.ranks = runtime.ranks
        self.adam = driven_adam(optimizer, runtime.preconditioner)
        self.scaler = keras_loss_scale_optimizer(sys._getframe(1))  # mixed precision
        # the second moment is read and written only where ThroughAdam sets it
        self.second = isinstance(runtime.preconditioner, preconditioning.ThroughAdam)
        self.moments = []  # (index in keys, Keras Adam's first moment, second or None): step_op
        # compress() is traced inside Horovod's tf.cond around the gradient: the graph around
        # that cond is where allreduce_grads runs (e.g. inside backward_passes_per_step's
        # aggregation cond, so the step op runs only on the steps that reduce).
        branch = tf.compat.v1.get_default_graph()
        self.graph = getattr(branch, "outer_graph", None) or branch
        names = gradient_names(call.vars)
        self.tensors = {names[i]: g for i, g in enumerate(call.grads) if _batchable(g)}
        self.keys = list(self.tensors)
        self.joined = set()  # the keys whose compress() has been traced
        self.sums = [False] * len(self.keys)  # per key: Horovod may sum it (``passable``)
        # the last key Horovod may sum (``passable``: the op is the call's), ``hands_over``
        self.closing = max((i for i, k in enumerate(self.keys) if _summable(self.tensors[k])),
                           default=None)
        self.traced_from = len(self.graph.get_operations())  # ``_results_since``
        self.results = {}
        self._step = self._plan = self._flags = self._summed = None
        self.countdown = Countdown()

    def passable(self, key, horovod_op):
        """The index of ``key`` in the plan where Horovod's allreduce may sum its gradient
        itself (float32, a static shape, ``horovod_op`` Average or Sum: the collective's result
        is then the mean or sum that hvdcomp would return), else None."""
        from horovod.tensorflow.mpi_ops import Average, Sum
        if not _summable(self.tensors[key]) or horovod_op not in (Average, Sum):
            return None
        index = self.keys.index(key)
        self.sums[index] = True
        return index

    def hands_over(self, index):
        """Whether the result of passable gradient ``index`` goes through its ``take`` op on
        every step whose exchange window is read (every step but the ``silent`` ones), Horovod's
        sum included, ending the decision's window there: the last passable gradient of the
        call (``closing``, traced last), whose take waits for every other result
        (``_results_since``): no one sum is known to come last (closed at the first variable's
        sum until 2026-12-06, ResNet-50's passed tape step read 1.1-1.6 s short). The others' sums
        are handed back in graph ops, where a Python op per gradient would cost ~0.1 ms per
        gradient and step (the 6-tensor MLP of recipe (d): 3.3 -> 5.0 ms)."""
        return index == self.closing

    def join(self, key, tensor):
        """Whether ``tensor`` (compressed under ``key``) belongs to this batch; records it."""
        if self.tensors.get(key) is not tensor or key in self.joined:
            return False
        self.joined.add(key)
        return True

    def step_op(self):
        """The batch's reduction op (its output: per key, the value a skipped step fills a
        gradient that Horovod summed with, else +inf; an input of every ``take``, which orders
        it after the reduction), built at the first call; it runs where Horovod's conds take
        their allreduce branch (this rank is in the process set, of 2+ ranks) and the step is
        not ``quiet``, and elsewhere does nothing (a ``tf.cond``: it holds stateful ops,
        which a dataflow ``switch`` would leave dead, and every op ordered after them too),
        returning +inf for every key."""
        if self._step is None:
            with self.graph.as_default():
                plan = self.plan_op()  # built by the first compress() of a passable key, or here

                def reduce():
                    if self.adam is not None:
                        return self._reduce_following_adam(plan)
                    values = [plan, scale_of(self.scaler)]
                    values += [_working(self.tensors[k]) for k in self.keys]
                    return tf.numpy_function(self._reduce, values, tf.float32, stateful=True,
                                             name=f"hvdcomp_{self.compressor.method}_step")

                def skip():
                    return tf.fill([len(self.keys)], np.float32(np.inf))
                here = _horovod_reduces(self.process_set)
                if tf.is_tensor(here) or here:
                    runs = tf.logical_not(self.quiet())
                    self._step = tf.cond(tf.logical_and(here, runs) if tf.is_tensor(here)
                                         else runs, reduce, skip)
                else:
                    self._step = skip()
                self._step.set_shape([len(self.keys)])
        return self._step

    def _reduce_following_adam(self, plan):
        """The step op where the user's Keras Adam owns the gradients: its moments and step
        count are read before the reduction and passed to it (``KerasAdamMoments``), and the
        moments it returns are assigned after it, so that Keras's update (traced later in the
        same function: tf.function orders the ops on one variable as written) reads them."""
        opt = self.adam
        build_untraced(opt, list(self.call.vars))
        by_key = dict(zip(gradient_names(self.call.vars), self.call.vars))
        for i, key in enumerate(self.keys):
            slot = opt._index_dict.get(opt._var_key(by_key[key]))
            if slot is not None and opt._momentums[slot].dtype == tf.float32:
                self.moments.append((i, opt._momentums[slot],
                                     opt._velocities[slot] if self.second else None))
        variables = [var for _, m, v in self.moments for var in (m, v) if var is not None]
        values = [plan, scale_of(self.scaler)] + [_working(self.tensors[k]) for k in self.keys]
        values += [var.read_value() for var in variables] + [tf.identity(opt.iterations)]
        out = tf.numpy_function(self._reduce, values, [tf.float32] * (1 + len(variables)),
                                stateful=True, name=f"hvdcomp_{self.compressor.method}_step")
        assigns = [var.assign(tf.reshape(new, tf.shape(var)))
                   for var, new in zip(variables, out[1:])]
        with tf.control_dependencies(assigns):
            return tf.identity(out[0])

    def _reduce(self, plan, scale, *values):
        self.results = {}
        grads, adam = values[:len(self.keys)], None
        if len(values) > len(self.keys):  # _reduce_following_adam: moments, then the step count
            adam = KerasAdamMoments.read(values[len(self.keys):], self.moments, len(self.keys),
                                         (self.adam.beta_1, self.adam.beta_2))
        with loss_scale.given(float(scale)):
            flats = self.compressor.reduce_batch_now(self.keys, grads, adam=adam,
                                                     process_set=self.process_set, by_horovod=plan)
        self.results = dict(zip(self.keys, flats))
        fills = np.array([f.fill if isinstance(f, HorovodSum) and f.fill is not None else np.inf
                          for f in flats], dtype=np.float32)
        if adam is None:
            return fills
        clip_as_keras(self.adam, adam)
        return [fills] + [moment for i, _, v in self.moments for moment in (
            (adam[i].momentum(),) if v is None else (adam[i].momentum(), adam[i].second()))]

    def summed_here(self, index):
        """Whether the result of gradient ``index`` is Horovod's sum as it is: the plan handed
        it to Horovod and the step op's output holds no fill for it (+inf; a skipped step's
        fill is ``take``'s). Computed for the batch once, beside the step op."""
        if self._summed is None:
            with self.graph.as_default():
                self._summed = tf.logical_and(self.plan_op(), tf.math.is_inf(self.step_op()))
        return self._summed[index]

    def take(self, key, step, reduced, *after):
        """The op of gradient ``key``: its result of this step's reduction, flat, times the op
        factor (an unsupported op raises ``UnsupportedOpError`` here, on every rank, after the
        step's reduction); for a gradient that Horovod summed, ``reduced`` as it is, or, on a
        skipped step, the fill in every element. ``step``: the batch op's output, the input
        that orders the two; ``reduced``: the reduced placeholder, or Horovod's sum; ``after``:
        inputs read for their order only (``_results_since``).

        It ends the decision's exchange window unless another result follows
        (``BatchedCompressor.handed_over``), so it runs for every compressed result and for the
        sum of the last gradient Horovod may sum, after every other sum (``hands_over``; not on a
        ``silent`` step, whose window nothing reads): ``tf.numpy_function`` hands its
        inputs over as views of their buffers and takes the array returned back without a copy,
        so a sum goes through it without one (on host memory). An op that only marked the window
        beside a sum in graph ops would not run: TensorFlow's graph optimiser removes a
        stateless op whose output is only a control input or a shape it can infer (until
        2026-12-02, the window of a step that passed every gradient ended at the step op,
        before Horovod's allreduces had finished)."""
        flat = self.results.pop(key)
        self.compressor.handed_over(self.process_set)
        if isinstance(flat, HorovodSum):
            if flat.fill is None:
                return reduced.reshape(-1)
            return np.full(self.tensors[key].shape.num_elements(), flat.fill, np.float32)
        factor = self.compressor.op_factor(np_adapter.reduced(reduced), key, self.ranks)
        return flat * flat.dtype.type(factor) if factor != 1 else flat


def switch(pred, tensor):
    """``(tensor where pred is False, tensor where pred is True)``: TensorFlow's dataflow
    ``Switch`` on the scalar bool tensor ``pred``. The side not taken is *dead*: the ops fed by
    it do not run, up to a ``merge``, which passes on the live one. So ops on either side run
    only on the steps that take it, as in the branches of a ``tf.cond``, without a copy, on any
    device, and without branch functions to trace (a ``tf.cond`` traces two, which made up most
    of hvdcomp's part of a training function's trace)."""
    taken_if_false, taken_if_true = tf.raw_ops.Switch(data=tensor, pred=pred)
    return taken_if_false, taken_if_true


def merge(*sides):
    """The one live tensor of ``sides`` (the ends of a ``switch``'s two sides, one dtype, any
    shapes): TensorFlow's dataflow ``Merge``."""
    return tf.raw_ops.Merge(inputs=list(sides))[0]


def select(pred, when_true, when_false):
    """``when_true`` on the steps where the scalar bool tensor ``pred`` holds, else
    ``when_false`` (``switch``, ``merge``: the one not chosen is neither read nor copied)."""
    return merge(switch(pred, when_false)[0], switch(pred, when_true)[1])


# compressor -> the StepBatch being traced (the last allreduce_grads call seen).
_TRACING = weakref.WeakKeyDictionary()


class Deferred:
    """The ``ctx`` of a traced tensor: builds its per-step ops in ``decompress`` (a tensor of an
    ``allreduce_grads`` call: its ``StepBatch``'s take op; any other tensor: its own
    reduction)."""
    DEFERRED = True

    def __init__(self, compressor, identity, tensor):
        self.compressor, self.key, self.tensor = compressor, identity.name, tensor
        self.process_set, self.horovod_op = identity.process_set, identity.horovod_op
        self.batch = self.index = None  # index: in the batch's plan (``sent``)
        call = identity.call
        if call is not None and _batchable(tensor):
            batch = _TRACING.get(compressor)
            if batch is None or batch.call.grads is not call.grads or identity.name in batch.joined:
                batch = _TRACING[compressor] = StepBatch(compressor, call, identity.process_set,
                                                         identity.optimizer)
            if batch.join(identity.name, tensor):
                self.batch = batch

    def sent(self, placeholder):
        """What Horovod's allreduce gets from ``compress``: ``placeholder``, or, for a gradient
        Horovod may sum (``StepBatch.passable``), the gradient (flat) on the steps whose plan
        passes it and ``placeholder`` on the others (a float32 vector either way; ``select``)."""
        self.index = None if self.batch is None else self.batch.passable(self.key,
                                                                           self.horovod_op)
        if self.index is None:
            return placeholder
        return select(self.batch.plan_op()[self.index], tf.reshape(self.tensor, [-1]),
                      placeholder)

    def build(self, output):
        tensor, key, comp = self.tensor, self.key, self.compressor
        if not tensor.dtype.is_floating:
            raise UnsupportedTensorError(
                f"{comp.method}: tensor {key!r} has dtype {tensor.dtype.name}; hvdcomp compresses "
                "floating-point gradients only")
        work = _working(tensor)
        if self.batch is None:
            def run(value, reduced):
                return comp.reduce_now(key, value, reduced, self.process_set)
            out = tf.numpy_function(run, [work, output], work.dtype, stateful=True,
                                    name="hvdcomp_" + comp.method)
        else:
            batch, step = self.batch, self.batch.step_op()

            def take(reduced, *after):
                return tf.numpy_function(functools.partial(batch.take, key),
                                         [step, reduced, *after], work.dtype, stateful=False,
                                         name=f"hvdcomp_{comp.method}_take")
            if self.index is None:
                out = take(output)
            else:  # Horovod's sum as it is, in graph ops, or take's result (``switch``)
                closes = batch.hands_over(self.index)
                taken, summed = switch(batch.silent() if closes
                                       else batch.summed_here(self.index), output)
                after = (_results_since(batch.graph, batch.traced_from),) if closes else ()
                out = merge(take(taken, *after), tf.reshape(summed, [-1]))
        out = tf.reshape(out, tf.shape(tensor))
        return tf.cast(out, tensor.dtype)
