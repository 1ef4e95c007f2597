"""Rank script (2 ranks): the user's Keras Adam, unchanged, in ``model.fit`` through Horovod's
Keras ``DistributedOptimizer`` with each compressor of ``argv[1:]`` (tests/variants.py), one
after the other, each reporting with ``case=<compressor>``. Reports, per
training step: whether hvdcomp compressed (``last_stats``), the first Dense kernel's Adam
moments ``m``/``v`` before and after as summaries that let the test check Keras's second-moment
update against the synchronised momentum (or, for a compressor whose result is the step, that
Keras's update is its rate times that step), the loss, and whether the weights are identical
across ranks; and how many times Horovod's allreduce function was traced."""
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import variants  # noqa: E402
from report import report  # noqa: E402

hvdk.init()


def fit(name):
    """One case: ``model.fit`` with compressor ``name``; its per-step log (see above)."""
    comp = variants.make(name)
    rng = np.random.default_rng(hvdk.rank())
    x = rng.normal(size=(16 * 24, 32)).astype(np.float32)
    y = (x[:, :4].argmax(1)).astype(np.int64)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                 tf.keras.layers.Dense(4)])
    opt = hvdk.DistributedOptimizer(tf.keras.optimizers.Adam(3e-3), compression=comp)
    model.compile(optimizer=opt,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    log = []

    def moments():
        if not getattr(opt, "_built", False):
            return None
        slot = opt._index_dict[opt._var_key(model.layers[0].kernel)]
        return opt._momentums[slot].numpy().copy(), opt._velocities[slot].numpy().copy()

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.before = moments()
            self.kernel = model.layers[0].kernel.numpy().copy()

        def on_train_batch_end(self, batch, logs=None):
            m, v = moments()
            stats = comp.last_stats
            digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
            entry = {"loss": float(logs["loss"]), "compressed": stats.compressed_elements,
                     "bytes_sent": stats.bytes_sent,
                     "identical": len(set(MPI.COMM_WORLD.allgather(digest))) == 1}
            if self.before is not None:
                # Keras: v' = v + (g^2 - v)(1 - b2); driven, g is the synchronised momentum m'
                expected = self.before[1] + (m * m - self.before[1]) * (1 - 0.999)
                entry["v_follows_m"] = bool(np.allclose(v, expected, rtol=1e-4, atol=1e-12))
            # the step itself (preconditioning.ThroughAdam): m is it, and Keras's update is lr * m
            moved = self.kernel - model.layers[0].kernel.numpy()
            entry["update_is_lr_m"] = float(np.abs(moved - 3e-3 * m).max()
                                            / (3e-3 * np.abs(m).max()))
            log.append(entry)

    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), Record()])
    # the traces of Horovod's allreduce function (a tf.function inside Keras's train function)
    return log, opt._allreduce_grads.experimental_get_tracing_count()


for name in sys.argv[1:]:
    log, traces = fit(name)
    report(case=name, rank=hvdk.rank(), log=log, allreduce_traces=traces)
