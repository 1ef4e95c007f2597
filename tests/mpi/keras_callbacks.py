"""Rank script (2 ranks): Horovod's own examples/tensorflow2/tensorflow2_keras_mnist.py as a user
runs it (its model, optimizer and every callback of ``horovod.tensorflow.keras.callbacks``), with
the compression ``argv[1]`` (a test name of tests/variants.py, or 'none'/'fp16': Horovod's own)
and the digits data made locally in place of MNIST's download. Reports the callbacks' effects:
the learning rate each epoch ended with, the averaged metrics, and whether the ranks' weights
are identical."""
import hashlib
import os
import sys

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import variants  # noqa: E402
from digits import load_digits  # noqa: E402
from report import report  # noqa: E402

NAME = sys.argv[1]
hvd.init()

pixels, labels = load_digits()
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(pixels.reshape(-1, 8, 8) / 16.0, tf.float32), tf.cast(labels, tf.int64)))
dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(32)

tf.keras.utils.set_random_seed(hvd.rank())  # the broadcast callback makes the weights agree
model = tf.keras.Sequential([
    tf.keras.layers.Reshape((8, 8, 1), input_shape=(8, 8)),
    tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
scaled_lr = 0.001 * hvd.size()
compression = (getattr(hvd.Compression, NAME) if NAME in ("none", "fp16")
               else variants.make(NAME))
opt = hvd.DistributedOptimizer(tf.optimizers.Adam(scaled_lr), backward_passes_per_step=1,
                               average_aggregated_gradients=True, compression=compression)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"], experimental_run_tf_function=False)


class Record(tf.keras.callbacks.Callback):
    """What the callbacks did: the learning rate at each epoch's end, and the epoch's logs
    (after MetricAverageCallback, which averages them over the ranks)."""
    epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({"lr": float(tf.keras.backend.get_value(self.model.optimizer.lr)),
                            "loss": float(logs["loss"]), "accuracy": float(logs["accuracy"])})


callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=0),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=0.5,
                                               start_epoch=2),
    Record(),
]
model.fit(dataset, steps_per_epoch=40 // hvd.size(), callbacks=callbacks, epochs=4, verbose=0)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
report(rank=hvd.rank(), epochs=Record.epochs,
       identical=len(set(MPI.COMM_WORLD.allgather(digest))) == 1)
