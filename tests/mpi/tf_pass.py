"""Rank script (2 ranks): TensorFlow gradients that the decision passes go through Horovod's own
allreduce in the traced step (``hvdcomp.facade.frontends.tensorflow.StepBatch.plan_op``). The digits
MLP trains 70 steps through ``hvd.DistributedGradientTape`` in a ``tf.function`` (SGD momentum
0.9) under Horovod's own ``Compression.none``, then under ``Marsit(decision='pass')``,
``Marsit(decision='pass', on_nonfinite='skip')`` and ``Marsit(decision='compress')``, and last
6 steps under each of the two ``pass`` settings with a NaN in the last rank's gradients at
step 3. Reports per run the bytes hvdcomp itself sent at each step
(``last_stats.bytes_sent``), Horovod's bytes per step, how many results each step handed over
(``BatchedCompressor.handed_over``: where the decision's exchange window ends), how many times
each step's batch was reduced by hvdcomp's step op (``reduce_batch_now``), how many times each
step ran its plan op's Python (``horovod_plan``; the others a plan granted ahead ended in the
graph), how many steps left the ranks identical, the final variables' digest and the step
count and ``total_stats`` read after the run; ``pass-unread`` is ``pass`` with nothing read
between steps (the granted steps counted only at the end); for the NaN runs, the gradients
returned at that step: whether each is all NaN, whether each is all zeros, and whether they are
identical across ranks."""
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

import hvdcomp  # noqa: E402
from report import report  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import load_digits  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
pixels, labels = load_digits()
xs = (pixels[:1400] / 16.0).astype(np.float32)[rank::size]
ys = labels[:1400][rank::size]


def digest(variables):
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in variables)).hexdigest()


def identical(variables):
    return len(set(MPI.COMM_WORLD.allgather(digest(variables)))) == 1


out = {}
runs = {"none": lambda: hvd.Compression.none,
        "pass": lambda: hvdcomp.Marsit(decision="pass"),
        "pass-skip": lambda: hvdcomp.Marsit(decision="pass", on_nonfinite="skip"),
        "compress": lambda: hvdcomp.Marsit(decision="compress")}


def train(compression, steps, poison_at=None, read=True):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(10)])
    variables = model.trainable_variables
    opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb, poison):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb)) * poison
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return grads

    hvd.broadcast_variables(variables, root_rank=0)
    ok, sent, summed, at_poison, handed, reduced, planned = 0, [], [], None, [], [], []
    if not isinstance(compression, type):  # count the results handed over (the window's end)
        def counted(calls, method):
            def call(*args, **kwargs):
                calls[-1] += 1
                return method(*args, **kwargs)
            return call
        compression.handed_over = counted(handed, compression.handed_over)
        compression.reduce_batch_now = counted(reduced, compression.reduce_batch_now)
        compression.horovod_plan = counted(planned, compression.horovod_plan)
    for step in range(steps):
        i = (step * 32) % (len(xs) - 32)
        bad = poison_at == step and rank == size - 1
        handed.append(0)
        reduced.append(0)
        planned.append(0)
        grads = train_step(tf.constant(xs[i:i + 32]), tf.constant(ys[i:i + 32]),
                           tf.constant(float("nan") if bad else 1.0))
        if poison_at == step:
            at_poison = [[bool(np.isnan(g.numpy()).all()) for g in grads],
                         [not np.any(g.numpy()) for g in grads], identical(grads)]
        ok += identical(variables)
        if read and not isinstance(compression, type):
            sent.append(compression.last_stats.bytes_sent)
            summed.append(compression.last_stats.horovod_bytes)
    counts = ({} if isinstance(compression, type) else
              {"step": compression.engine.step, "total": compression.total_stats.as_dict()})
    return {"sent": sent, "summed": summed, "identical": ok, "digest": digest(variables),
            "at_poison": at_poison, "handed": handed, "reduced": reduced, "planned": planned,
            **counts}


for name, make in runs.items():
    out[name] = train(make(), 70)
out["pass-unread"] = train(runs["pass"](), 70, read=False)
out["nan"] = train(runs["pass"](), 6, poison_at=3)
out["nan-skip"] = train(runs["pass-skip"](), 6, poison_at=3)
report(rank=rank, **out)
