"""TensorFlow adapter (eager, tf.function and Keras).

Horovod's TensorFlow integration calls ``compress``/``decompress`` while tracing (the
DistributedGradientTape and DistributedOptimizer always trace their all-reduce, even in eager
mode), so Python there runs once per trace, not once per step. This adapter therefore defers the
work: ``compress`` returns a 1-element float32 placeholder for Horovod's allreduce, and
``decompress`` returns a ``tf.numpy_function`` op that, at every step, hands the gradient's value
to the compressor's ``reduce_now`` (the shared NumPy backend: no second implementation).

Ordering: the op is stateful, and ``tf.function`` runs stateful ops in program order (automatic
control dependencies; Horovod wraps each allreduce in a ``tf.cond``, which is stateful too), so
hvdcomp's collectives run in trace order, the same on every rank. (No explicit chaining: each
op lives in its own ``tf.cond`` branch graph, where a chain could not link them anyway.)
TF1-style sessions (no automatic control dependencies) are not supported. State is keyed by the variable's name (read from Horovod's ``allreduce_grads``
frame), so a retrace (new input shape) finds the same state.
"""
import sys

import tensorflow as tf

from hvdcomp.frontends import Identity

DEFERRED = True


def tensor_identity(tensor, depth=64):
    """``(name, variable)``: the variable's name (with ``#index`` appended when the list holds
    several variables of that name) for DistributedGradientTape/Optimizer gradients; else
    ``(name, None)`` with the ``name=`` of ``hvd.allreduce``, or the graph tensor's name (None in
    eager).

    Horovod's ``allreduce_grads(grads, vars)`` loops ``for i, grad in enumerate(grads)``; the
    index ``i`` is a local of a frame below it (AutoGraph may add frames in between and rename
    functions ``tf__...``), and ``vars[i]`` is the variable, named identically on every rank.
    """
    frame = sys._getframe(2)
    index, call_name = None, None
    for _ in range(depth):
        if frame is None:
            break
        loc = frame.f_locals
        if index is None and "grad" in loc and isinstance(loc.get("i"), int):
            index = loc["i"]
        vars_ = loc.get("vars")
        if index is not None and isinstance(vars_, (list, tuple)) and index < len(vars_):
            name = vars_[index].name
            if sum(v.name == name for v in vars_) > 1:  # e.g. two standalone layers' 'kernel:0'
                name = f"{name}#{index}"
            return Identity(name, vars_[index])
        if call_name is None and frame.f_code.co_name.endswith("allreduce") \
                and isinstance(loc.get("name"), str):
            call_name = loc["name"]
        frame = frame.f_back
    if call_name is not None:
        return Identity(call_name)
    if not tf.executing_eagerly() and hasattr(tensor, "name"):
        return Identity(tensor.name)
    return Identity(None)


def placeholder(tensor, values):
    """``values`` (``hvdcomp.checks.placeholder_values``) as the float32 tensor Horovod
    all-reduces in place of the gradient."""
    return tf.constant(values, dtype=tf.float32)


class Deferred:
    """The ``ctx`` of a traced tensor: builds the per-step reduction op in ``decompress``."""
    DEFERRED = True
    _anonymous = 0

    def __init__(self, compressor, name, tensor):
        if name is None:  # eager hvd.allreduce without a name: number calls in program order
            Deferred._anonymous += 1
            name = f"@tf{Deferred._anonymous:06d}"
        self.compressor, self.key, self.tensor = compressor, name, tensor

    def build(self, output):
        tensor, key, comp = self.tensor, self.key, self.compressor
        if not tensor.dtype.is_floating:
            from hvdcomp.errors import UnsupportedTensorError
            raise UnsupportedTensorError(
                f"{comp.method}: tensor {key!r} has dtype {tensor.dtype.name}; hvdcomp compresses "
                "floating-point gradients only")
        work = tf.cast(tensor, tf.float64 if tensor.dtype == tf.float64 else tf.float32)

        def run(value, reduced):
            return comp.reduce_now(key, value, reduced)

        out = tf.numpy_function(run, [work, output], work.dtype, stateful=True,
                                name="hvdcomp_" + comp.method)
        out = tf.reshape(out, tf.shape(tensor))
        return tf.cast(out, tensor.dtype)
