"""Rank script: plain Keras 3 (TF_USE_LEGACY_KERAS unset, so ``tf.keras`` is the ``keras``
package) with Horovod's TensorFlow front ends and hvdcomp.

1. ``hvd.DistributedGradientTape`` over a Keras 3 model's variables (which have no ``ref()``,
   horovod #4290, patched in scripts/horovod-patches/): the gradients of rank-dependent data are
   reduced, with Horovod's ``Compression.none`` (checked against the mean of every rank's local
   gradient) and with ``hvdcomp.Marsit`` (the same bits on every rank, not the local gradient).
2. ``horovod.tensorflow.keras.DistributedOptimizer`` around a Keras 3 optimizer, which Keras 3 would
   never ask to reduce: the error each rank gets (its type and message).

Every rank reports its numbers; the test (tests/test_stack.py) compares them.

    TF_USE_LEGACY_KERAS=0 mpirun -np 2 python tests/mpi/keras3.py
"""
import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

import hvdcomp  # noqa: E402
from report import report_horovod  # noqa: E402

hvd.init()
RANK = hvd.rank()


def model_and_data():
    keras.utils.set_random_seed(0)  # the same weights on every rank
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(3)])
    rng = np.random.default_rng(100 + RANK)  # different data per rank
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    return model, x, y


def gradients(compression):
    """(local gradients, reduced gradients) of one batch, as NumPy arrays, and the module of the
    model's variables' class (Keras 3's)."""
    model, x, y = model_and_data()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x))
    local = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    dist = hvd.DistributedGradientTape(tape, compression=compression)
    reduced = [g.numpy() for g in dist.gradient(loss, model.trainable_variables)]
    return local, reduced, type(model.trainable_variables[0]).__module__


def digest(arrays):
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


local, exact, variable_type = gradients(hvd.Compression.none)
_, marsit, _ = gradients(hvdcomp.Marsit)
try:
    hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=hvdcomp.Marsit)
    refusal = None
except Exception as exc:  # noqa: BLE001  the test checks the type and the message
    refusal = f"{type(exc).__name__}: {exc}"

report_horovod(hvd, {
    "rank": RANK, "keras": keras.__version__, "variable_type": variable_type,
    "local": [a.tolist() for a in local], "exact": [a.tolist() for a in exact],
    "marsit_digest": digest(marsit), "marsit_equals_local": all(
        np.array_equal(a, b) for a, b in zip(marsit, local)),
    "marsit_finite": bool(all(np.isfinite(a).all() for a in marsit)),
    "refusal": refusal,
})
