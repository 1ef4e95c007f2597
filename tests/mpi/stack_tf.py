"""Rank script: Horovod + TensorFlow (Keras 2) on real ranks.

Each rank allreduces rank-dependent tf tensors (eagerly and inside a ``tf.function``), then
trains a tiny Keras model for a few steps with ``hvd.DistributedGradientTape`` inside a
``tf.function``, starting from deliberately different per-rank weights that are fixed by a
broadcast from rank 0. Rank 0 also trains a serial reference on all ranks' data concatenated,
which SGD on averaged gradients must reproduce. Rank 0 prints one ``RESULT {json}`` line per
rank (see report.py); the test does every comparison."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import horovod.tensorflow as hvd  # noqa: E402
from report import report_horovod  # noqa: E402

STEPS, LR, BATCH = 4, 0.2, 8


def make_model(seed):
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(3, activation="tanh", input_shape=(4,)),
        tf.keras.layers.Dense(1),
    ])
    model.build((None, 4))
    return model


def data(rank):
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((BATCH, 4)).astype(np.float32)
    y = rng.standard_normal((BATCH, 1)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def flat(model):
    return np.concatenate([v.numpy().reshape(-1) for v in model.trainable_variables]).tolist()


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {"rank": rank, "size": size, "local_rank": hvd.local_rank(),
           "mpi_enabled": bool(hvd.mpi_enabled())}

    # --- allreduce of rank-dependent tensors -------------------------------------------
    base = tf.reshape(tf.range(6, dtype=tf.float64), (2, 3))
    x64 = base * (rank + 1) + 10.0 * rank
    out["sum64"] = hvd.allreduce(x64, op=hvd.Sum, name="stack.sum64").numpy().tolist()
    out["avg64"] = hvd.allreduce(x64, op=hvd.Average, name="stack.avg64").numpy().tolist()

    @tf.function
    def graph_avg(t):
        return hvd.allreduce(t, op=hvd.Average, name="stack.avg32")

    x32 = (tf.cast(base, tf.float32) + 1.0) * (rank + 1)
    out["avg32"] = graph_avg(x32).numpy().tolist()
    xi = tf.range(5, dtype=tf.int64) * (rank + 1)
    out["sumint"] = hvd.allreduce(xi, op=hvd.Sum, name="stack.sumint").numpy().tolist()

    # --- DistributedGradientTape inside tf.function -------------------------------------
    model = make_model(seed=rank)          # different on every rank on purpose
    out["own_init"] = flat(model)
    hvd.broadcast_variables(model.variables, root_rank=0)
    out["init"] = flat(model)
    opt = tf.keras.optimizers.SGD(learning_rate=LR)
    loss_fn = tf.keras.losses.MeanSquaredError()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x, y = data(rank)
    out["losses"] = [float(train_step(x, y)) for _ in range(STEPS)]
    out["final"] = flat(model)

    if rank == 0:
        # serial reference: same initial weights, all ranks' batches at once
        ref = make_model(seed=0)
        xs, ys = zip(*(data(r) for r in range(size)))
        xa, ya = tf.concat(xs, 0), tf.concat(ys, 0)
        ropt = tf.keras.optimizers.SGD(learning_rate=LR)
        for _ in range(STEPS):
            with tf.GradientTape() as tape:
                loss = loss_fn(ya, ref(xa, training=True))
            grads = tape.gradient(loss, ref.trainable_variables)
            ropt.apply_gradients(zip(grads, ref.trainable_variables))
        out["reference"] = flat(ref)

    report_horovod(hvd, out)


if __name__ == "__main__":
    main()
