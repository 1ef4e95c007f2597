"""Rank script: per-step training time in TensorFlow, per compressor, in one job: the twin of
``train_step_bench.py`` (PyTorch), same models, same batch, same way of timing.

    benchmarks/cluster.sh run --per-host 2 -- .venv/bin/python benchmarks/tf_step_bench.py \
        --model mlp48 --api tape --label 1gbit --out train.jsonl

(``benchmarks/tf_vs_torch.sh`` runs the whole comparison.) Models: ``mlp48``, the 25M MLP of 48
tensors of issue #19 (24 Dense(1024), ReLU between); ``mlp``, the 25M 2-layer MLP (5000 -> 2500
-> 5000). Per rank a batch of 4 random vectors against random classes: little compute, so the
step is dominated by the gradient reduction, as in PyTorch's twin.

For every method (Horovod fp32/fp16, every hvdcomp compressor) a fresh model (the same seed on
every rank) and SGD(1e-4), through the stock Horovod TF API chosen by ``--api``:

- ``tape``: ``hvd.DistributedGradientTape(tape, compression=C)`` inside a ``tf.function`` step;
  a step is one call of it (its result fetched), after a barrier;
- ``keras``: ``model.fit`` with ``hvd.keras.DistributedOptimizer(SGD, compression=C)``; a step is
  one batch, timed by a callback from ``on_train_batch_begin`` (after a barrier) to
  ``on_train_batch_end``.

``--warmup`` steps (tracing, first touch), then ``--steps`` timed steps (tf.function: fewer when
the last warm-up step took longer than ``--max-seconds / steps``); a step's time is the slowest
rank's. Also measured once: the tf.function step without Horovod (``compute``). Rank 0 appends
one JSON object per method to ``--out`` (``kind: "train"``, ``framework: "tensorflow"``), as
``train_step_bench.py`` does.
"""
import argparse
import os
import time

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

from methods import (add_step_args, make_compression, report_step, step_phases,  # noqa: E402
                     step_record)
BATCH = 4
MODELS = {"mlp": (5000, [2500, 5000]), "mlp48": (1024, [1024] * 24)}  # input width, layer widths


def make_model(name):
    width, layers = MODELS[name]
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential(
        [tf.keras.layers.Dense(n, activation="relu" if i < len(layers) - 1 else None,
                               input_shape=(width,) if i == 0 else ())
         for i, n in enumerate(layers)])


def tape_steps(model, comp, x, y, warmup, steps, comm, max_seconds=None):
    """``warmup`` + ``steps`` tf.function steps through DistributedGradientTape (``comp`` None:
    the plain tape, no Horovod): their slowest-rank seconds; fewer steps when the last warm-up
    step took longer than ``max_seconds / steps`` (the first one traces: 10-25 s here)."""
    opt = tf.keras.optimizers.SGD(1e-4)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb))
        if comp is not None:
            tape = hvd.DistributedGradientTape(tape, compression=comp)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    times, x, y = [], tf.constant(x), tf.constant(y)
    while len(times) < warmup + steps:
        comm.Barrier()
        t0 = time.perf_counter()
        step(x, y).numpy()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        if len(times) == warmup and max_seconds:
            steps = max(1, min(steps, int(max_seconds // times[-1])))
    return times


def keras_steps(model, comp, x, y, warmup, steps, comm, max_seconds=None):
    """``warmup`` + ``steps`` model.fit batches with hvd.keras' DistributedOptimizer:
    slowest-rank seconds each (a fit's length is fixed beforehand: no ``max_seconds``)."""
    model.compile(optimizer=hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(1e-4),
                                                      compression=comp),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = []

    class Timer(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            comm.Barrier()
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(comm.allreduce(time.perf_counter() - self.t0, op=MPI.MAX))

    reps = np.concatenate([x] * (warmup + steps)), np.concatenate([y] * (warmup + steps))
    model.fit(*reps, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[Timer()])
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp48")
    ap.add_argument("--api", choices=("tape", "keras"), default="tape")
    add_step_args(ap)
    args = ap.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = hvd.rank(), hvd.size()
    width, layers = MODELS[args.model]
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((BATCH, width)).astype(np.float32)
    y = rng.integers(0, layers[-1], BATCH).astype(np.int64)
    probe = make_model(args.model)
    params = sum(int(np.prod(v.shape)) for v in probe.trainable_variables)
    tensors = len(probe.trainable_variables)
    compute = min(tape_steps(probe, None, x, y, 1, 3, comm)[1:])
    if rank == 0:
        print(f"# tf step bench ({args.api}): {size} ranks, {params / 1e6:.1f}M parameters in "
              f"{tensors} tensors, compute (tf.function step, no Horovod) {compute * 1e3:.0f} ms",
              flush=True)

    out = open(args.out, "a") if (args.out and rank == 0) else None
    run = tape_steps if args.api == "tape" else keras_steps
    for method in args.methods.split(","):
        status, times, sent, phases = "ok", [], [], []
        try:
            comp = make_compression(method, hvd)
            model = make_model(args.model)
            hvd.broadcast_variables(model.variables, root_rank=0)
            times = run(model, comp, x, y, args.warmup, args.steps, comm, args.max_seconds)
            st = getattr(comp, "last_stats", None)
            if st is not None:
                sent.append(comm.allreduce(st.bytes_sent, op=MPI.SUM) / size)
                phases.append(step_phases(comm, comp))  # the last step's only
        except Exception as exc:  # noqa: BLE001 - reported, the other methods still run
            status = f"error: {type(exc).__name__}: {exc}"
        comm.Barrier()
        rec = step_record(
            {"kind": "train", "framework": "tensorflow", "api": args.api, "model": args.model,
             "label": args.label, "ranks": size, "hosts": hvd.cross_size(), "method": method,
             "status": status, "params": params, "tensors": tensors, "compute_seconds": compute},
            times[args.warmup:], times[0] if times else None, sent, phases)
        if rank == 0:
            report_step(out, rec, f"tf-{args.api}")
    if out:
        out.close()


if __name__ == "__main__":
    main()
