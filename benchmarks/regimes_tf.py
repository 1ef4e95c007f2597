"""Rank script: issue #31's regimes benchmark in TensorFlow, the twin of ``regimes.py``: ResNet-50
from ``tf.keras.applications`` (25.6M parameters, ``weights=None``, 1000 classes, ``--image``
pixels square, default 224 as Horovod's benchmarks: ``regimes.py`` says why) on
synthetic images, batch ``--batch`` (4) per rank, SGD(lr 0.01), through the stock Horovod TF
APIs:

- ``--api tape``: ``hvd.DistributedGradientTape(tape, compression=C)`` inside a ``tf.function``
  step (its loss fetched);
- ``--api keras``: ``hvd.keras.DistributedOptimizer(SGD, compression=C)`` compiled into the
  model, a step being ``model.train_on_batch`` (the train function ``model.fit`` runs per batch,
  without fit's per-epoch setup, which a short timed loop would otherwise pay each call).

    benchmarks/regimes.sh      # MODELS="tf-tape tf-keras": on the emulated cluster
    mpirun -np 4 --oversubscribe .venv/bin/python benchmarks/regimes_tf.py --api tape

The same configurations, rounds and records as ``regimes.py`` (``rounds.py``): the ceiling (the
same step without Horovod), Horovod fp32 / fp16 and every hvdcomp method with its defaults;
``--sequential`` (the default in ``regimes.sh``: a configuration's first step traces its graph,
and 9 ResNet-50s with their graphs x 4 ranks are more than this machine holds) times each beside
the ceiling. Records' ``model``: ``tf-resnet50-<api>``.
"""
import argparse
import os

import numpy as np
# Horovod's Keras front end needs Keras 2: with TensorFlow >= 2.16 that is tf-keras, which tf.keras
# becomes where this is set before TensorFlow is imported (scripts/setup.sh installs it).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402  before Horovod: THREAD_MULTIPLE (see DESIGN.md)
import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

import rounds  # noqa: E402  this folder
from methods import make_compression  # noqa: E402
from rounds import Timed  # noqa: E402


def build(args):
    tf.keras.utils.set_random_seed(0)  # the same weights on every rank
    return tf.keras.applications.ResNet50(weights=None, classes=1000,
                                          input_shape=(args.image, args.image, 3))


class Config(Timed):
    """One configuration's model, SGD and compressor, stepped through ``args.api``."""

    def __init__(self, args, method):
        comp = None if method == "ceiling" else make_compression(method, hvd)
        super().__init__(method, comp)
        self.model = model = build(args)
        opt = tf.keras.optimizers.SGD(0.01)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
        if args.api == "keras":
            model.compile(optimizer=opt if comp is None else
                          hvdk.DistributedOptimizer(opt, compression=comp), loss=loss_fn)
            self.step = model.train_on_batch
            return

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            if comp is not None:
                tape = hvd.DistributedGradientTape(tape, compression=comp)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        self.step = step

    def one_step(self, batch):
        np.asarray(self.step(*batch))  # the loss fetched: the step has run

    def drop(self):
        self.model = self.step = self.comp = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=("tape", "keras"), default="tape")
    rounds.add_args(ap)
    ap.set_defaults(batch=4)
    args = ap.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rng = np.random.default_rng(hvd.rank())
    batch = (tf.constant(rng.standard_normal((args.batch, args.image, args.image, 3)),
                         tf.float32),
             tf.constant(rng.integers(0, 1000, args.batch), tf.int64))
    model = build(args)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    job = {"model": f"tf-resnet50-{args.api}", "api": args.api, "ranks": hvd.size(),
           "hosts": hvd.cross_size(), "params": params,
           "tensors": len(model.trainable_variables), "batch": args.batch}
    del model
    ones = tf.ones([params])
    job["allreduce_seconds"] = rounds.allreduce_seconds(
        comm, lambda: hvd.allreduce(ones, name="regimes.probe", op=hvd.Sum).numpy())
    del ones
    rounds.run(args, comm, batch, lambda m: Config(args, m), job)


if __name__ == "__main__":
    main()
