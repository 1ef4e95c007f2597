"""Rank script (2 ranks): a Keras user's Adam in ``model.fit`` through Horovod's Keras
``DistributedOptimizer``, with settings that change the gradients between Horovod's reduction
and Adam's update, on a digits MLP. ``argv[1]``: the case, 'mixed' (``mixed_float16`` policy:
Keras wraps the optimizer in a LossScaleOptimizer; 64 hidden units) or 'clipnorm'
(``Adam(global_clipnorm=0.05)``; 256 hidden units);
``argv[2:]``: the compressions (test names of tests/variants.py, or 'none'). Reports per
compression the last epoch's loss and accuracy on the training data, the held-out loss, how many
epochs had a non-finite loss, and whether the ranks' weights are identical."""
import hashlib
import math
import os
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import variants  # noqa: E402
from digits import load_digits  # noqa: E402
from report import report  # noqa: E402

CASE, NAMES = sys.argv[1], sys.argv[2:]
hvd.init()
if CASE == "mixed":
    tf.keras.mixed_precision.set_global_policy("mixed_float16")

pixels, labels = load_digits()
x, y = (pixels / 16.0).astype(np.float32), labels.astype(np.int64)
cut = int(0.8 * len(x))
xtr, ytr = x[:cut][hvd.rank()::hvd.size()], y[:cut][hvd.rank()::hvd.size()]
xte, yte = x[cut:], y[cut:]


def fit(name):
    tf.keras.utils.set_random_seed(0)
    hidden = 256 if CASE == "clipnorm" else 64
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(hidden, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(hidden, activation="relu"),
        tf.keras.layers.Dense(10),
        tf.keras.layers.Activation("linear", dtype="float32"),  # float32 logits
    ])
    kwargs = {"global_clipnorm": 0.05} if CASE == "clipnorm" else {}
    compression = hvd.Compression.none if name == "none" else variants.make(name)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(3e-3, **kwargs),
                                   compression=compression)
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(xtr, ytr, batch_size=32, epochs=5, shuffle=False, verbose=0)
    held_out = model.evaluate(xte, yte, verbose=0)
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    return {"loss": hist.history["loss"][-1], "accuracy": hist.history["accuracy"][-1],
            "held_out_loss": float(held_out[0]),
            "nonfinite_epochs": sum(not math.isfinite(v) for v in hist.history["loss"]),
            "identical": len(set(MPI.COMM_WORLD.allgather(digest))) == 1}


report(rank=hvd.rank(), **{name: fit(name) for name in NAMES})
