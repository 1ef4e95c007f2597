"""Rank script (2 ranks): bad input through DistributedGradientTape in a tf.function, where a
step's gradients are reduced as one batch (hvdcomp.facade.frontends.tensorflow.StepBatch). Arg:
method (a class of hvdcomp/registry.py). Reports, per rank:
- nan_error: the error message of a step whose gradient is NaN on the last rank only
  (on_nonfinite='raise'), or None;
- nan_state_kept: the compressor's step count and state digest unchanged by that step;
- propagated: [the NaN variable's gradient all NaN, the other gradient all zero, gradients
  identical across ranks, the compressor's skipped-step count] with the default
  on_nonfinite='propagate';
- shape_error: the error message when the last rank's model has a differently shaped variable;
- after: a clean step after the failed ones still works and is identical across ranks.
"""
import hashlib
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

from hvdcomp import registry  # noqa: E402
from report import report  # noqa: E402

method = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()
last = size - 1
out = {}


def same_everywhere(value):
    return len(set(MPI.COMM_WORLD.allgather(value))) == 1


def state_digest(comp):
    h = hashlib.sha256()
    for key, value in sorted(comp.state_dict()["state"].items()):
        h.update(key.encode())
        for part in value if isinstance(value, tuple) else (value,):
            h.update(np.asarray(part).tobytes())
    return h.hexdigest()


def make_vars(width):
    w = tf.Variable(tf.random.stateless_normal([width, 64], seed=[0, 1]), name="w")
    b = tf.Variable(tf.random.stateless_normal([4096], seed=[0, 2]), name="b")
    return [w, b]


def grads_fn(comp, variables):
    """A tf.function returning the reduced gradients of sum(x * w) + sum(b * bad)."""
    @tf.function
    def grads(x, bad):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(x * variables[0]) + tf.reduce_sum(variables[1] * bad)
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        return tape.gradient(loss, variables)
    return grads


def error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - TensorFlow wraps the op's error
        return f"{type(exc).__name__}: {exc}"
    return None


variables = make_vars(64)
x = tf.random.stateless_normal([64, 64], seed=[rank, 3])
clean = tf.ones([4096])
poisoned = tf.tensor_scatter_nd_update(clean, [[5]], [np.nan]) if rank == last else clean

# 1. on_nonfinite='raise': the error on every rank, the state unchanged.
comp = registry.METHODS[method](on_nonfinite="raise")
grads = grads_fn(comp, variables)
grads(x, clean)  # one good step: state to keep
before = (comp.engine.step, state_digest(comp))
out["nan_error"] = error_of(lambda: grads(x, poisoned))
out["nan_state_kept"] = (comp.engine.step, state_digest(comp)) == before
good = grads(x, clean)
out["after"] = same_everywhere(b"".join(g.numpy().tobytes() for g in good))

# 2. the default on_nonfinite='propagate': NaN for the bad tensor, zeros for the other.
comp = registry.METHODS[method]()
grads = grads_fn(comp, variables)
gw, gb = grads(x, poisoned)
out["propagated"] = [bool(np.isnan(gb.numpy()).all()), bool((gw.numpy() == 0).all()),
                     same_everywhere(gw.numpy().tobytes() + gb.numpy().tobytes()),
                     comp.engine.skipped]

# 3. a variable shaped differently on the last rank.
comp = registry.METHODS[method]()
odd = make_vars(64 if rank != last else 32)
xo = tf.random.stateless_normal([odd[0].shape[0], 64], seed=[rank, 4])
out["shape_error"] = error_of(lambda: grads_fn(comp, odd)(xo, clean))
report(rank=rank, **out)
