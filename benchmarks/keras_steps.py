"""Rank script: recipe (d) (examples/train_tf.py's Keras ``model.fit`` of the digits MLP, Adam lr
1e-3, batch 32) step by step, for one compression: rank 0 prints the first batch's time (the
train function's trace and the first step), the median of the rest of the first epoch (the
decision's probe), the median and sum of the later epochs' steps (held choice), and, with the
decision's log on, its choice and the exchange window of each candidate.

    mpirun -np 2 --oversubscribe .venv/bin/python benchmarks/keras_steps.py marsit   # or none
    benchmarks/cluster.sh run --per-host 2 -- .venv/bin/python benchmarks/keras_steps.py marsit

The method is Horovod's ``none``/``fp16`` or a registry preset, with ``@key=value`` overrides in
Python literals (``"topk@decision='compress'"``). Environment: ``EPOCHS`` (default 20),
``OPTIMIZER`` (``adam``, the recipe's, or ``sgd``: Keras SGD at lr 0.1, to tell Adam's part of a
step from the rest), ``STEPS_SHOWN`` (default 0): also print the first that many steps' times
and the median and p90 of steps 2 on.
"""
import logging
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from hvdcomp import registry  # noqa: E402
from train_tf import data, make_model  # noqa: E402
from methods import parse_spec  # noqa: E402


def main():
    hvd.init()
    if hvd.rank() == 0:
        logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    method, epochs = sys.argv[1], int(os.environ.get("EPOCHS", 20))
    tf.keras.utils.set_random_seed(0)
    (xs, ys), _ = data(hvd.rank(), hvd.size())
    if method in ("none", "fp16"):
        compression = getattr(hvd.Compression, method)
    else:
        name, settings = parse_spec(method)
        compression = registry.build(name, **settings)
    model = make_model()
    optimizer = (tf.keras.optimizers.SGD(0.1) if os.environ.get("OPTIMIZER") == "sgd"
                 else tf.keras.optimizers.Adam(1e-3))
    model.compile(optimizer=hvdk.DistributedOptimizer(optimizer, compression=compression),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ends = []
    batch_end = tf.keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    start = time.perf_counter()
    model.fit(xs, ys, batch_size=32, epochs=epochs, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), batch_end])
    ms = np.diff([start] + ends) * 1e3
    per_epoch = len(ms) // epochs
    if hvd.rank() == 0:
        print(f"{method}: {ends[-1] - start:.2f} s in all; first batch {ms[0]:.0f} ms; rest of "
              f"epoch 1 median {np.median(ms[1:per_epoch]):.1f} ms, sum "
              f"{ms[1:per_epoch].sum() / 1e3:.3f} s; epochs 2-{epochs} median "
              f"{np.median(ms[per_epoch:]):.1f} ms, sum {ms[per_epoch:].sum() / 1e3:.2f} s",
              flush=True)
        shown = int(os.environ.get("STEPS_SHOWN", 0))
        if shown:
            print("STEPS", " ".join(f"{x:.1f}" for x in ms[:shown]), "| median 2-end",
                  f"{np.median(ms[1:]):.2f} | p90 {np.percentile(ms[1:], 90):.2f}", flush=True)


if __name__ == "__main__":
    main()
