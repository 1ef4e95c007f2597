"""Rank script (2 ranks): Keras ``model.fit`` through Horovod's Keras ``DistributedOptimizer``
with settings that return the optimizer's step itself (BinSGDM, ``precondition='adam'``) under
Keras optimizers that apply their own momentum or normalisation, and under Keras Adam/AdamW
(which apply that step: ``hvdcomp.preconditioning.ThroughAdam``) and SGD with momentum, to which
BinSGDM adapts. Reports, per case, the error
raised (type name and message) or None, and for the accepted cases whether the weights are
identical across ranks."""
import hashlib

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

import hvdcomp  # noqa: E402
from report import report  # noqa: E402

hvdk.init()
CASES = {
    "adam-precondition+sgd-momentum": (lambda: hvdcomp.Marsit(precondition="adam"),
                                       lambda: tf.keras.optimizers.SGD(1e-3, momentum=0.9)),
    "binsgdm+sgd-momentum": (hvdcomp.BinSGDM, lambda: tf.keras.optimizers.SGD(1e-3, momentum=0.9)),
    "adam-precondition+adamw-amsgrad": (lambda: hvdcomp.Marsit(precondition="adam"),
                                        lambda: tf.keras.optimizers.AdamW(1e-3, amsgrad=True)),
    "binsgdm+legacy-adam": (hvdcomp.BinSGDM, lambda: tf.keras.optimizers.legacy.Adam(1e-3)),
    "binsgdm+sgd": (hvdcomp.BinSGDM, lambda: tf.keras.optimizers.SGD(1e-3)),
    "binsgdm+adam": (hvdcomp.BinSGDM, lambda: tf.keras.optimizers.Adam(1e-3)),
    "adam-precondition+adamw": (lambda: hvdcomp.Marsit(precondition="adam"),
                                lambda: tf.keras.optimizers.AdamW(1e-3)),
}
rng = np.random.default_rng(hvdk.rank())
x, y = rng.normal(size=(64, 16)).astype(np.float32), rng.integers(0, 4, 64)
out = {}
for name, (compression, optimizer) in CASES.items():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(16,)),
                                 tf.keras.layers.Dense(4)])
    model.compile(optimizer=hvdk.DistributedOptimizer(optimizer(), compression=compression()),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
        digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
        out[name] = {"error": None,
                     "identical": len(set(MPI.COMM_WORLD.allgather(digest))) == 1}
    except Exception as exc:  # noqa: BLE001 - reported
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
report(rank=hvdk.rank(), **out)
