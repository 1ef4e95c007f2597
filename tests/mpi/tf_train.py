"""Rank script: a hvdcomp compressor with TensorFlow 2.15 through Horovod's own wrappers:
eager hvd.allreduce, DistributedGradientTape inside tf.function (with a retrace and a variable
that gets no gradient on some steps), and Keras model.fit with hvd.keras' DistributedOptimizer;
variables bit-identical across ranks after every step. Args: one or more cases of two each,
``method epochs`` (method: a preset of hvdcomp/registry.py, e.g. marsit, built with its
defaults; SGD at its "tf-test" rate), run one after the other in this launch
(``tf.keras.backend.clear_session()`` before each, so its variables have the same names in
every case); each reports its fields with ``case=method``."""
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

from hvdcomp import registry  # noqa: E402
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import expect  # noqa: E402  (tests/expect.py)
from report import cases, report  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import load_digits  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def identical(variables):
    return len(set(MPI.COMM_WORLD.allgather(digest(variables)))) == 1


pixels, labels = load_digits()
x = (pixels / 16.0).astype(np.float32)
y = labels
xtr, ytr, xte, yte = x[:1400], y[:1400], x[1400:], y[1400:]
xs, ys = xtr[rank::size], ytr[rank::size]


def op_types(graph, counts, seen=None):
    """Op type -> count in ``graph`` and its nested functions, each function counted once (a
    function nested two levels down is listed by both levels: ``seen``, the names counted);
    Horovod's conds (a tf.cond whose true branch holds a HorovodAllreduce) counted as
    'hvd:If' / 'hvd:StatelessIf'."""
    seen = set() if seen is None else seen
    for op in graph.get_operations():
        counts[op.type] = counts.get(op.type, 0) + 1
        if op.type in ("If", "StatelessIf"):
            branch = graph._functions.get(op.get_attr("then_branch").name)
            if any(o.type == "HorovodAllreduce" for o in branch.graph.get_operations()):
                counts["hvd:" + op.type] = counts.get("hvd:" + op.type, 0) + 1
    for name, fn in graph._functions.items():  # cond branches and other nested functions
        if getattr(fn, "graph", None) is not None and name not in seen:
            seen.add(name)
            op_types(fn.graph, counts, seen)
    return counts


def eager_case(method, out):
    """1. eager hvd.allreduce."""
    comp = registry.build(method)
    t = tf.random.stateless_normal([5000], seed=[rank, 1])
    r = hvd.allreduce(t, name="eager.t", compression=comp)
    out["eager_identical"] = len(set(MPI.COMM_WORLD.allgather(r.numpy().tobytes()))) == 1
    out["eager_bytes"] = comp.last_stats.bytes_sent


def tape_case(method, epochs, lr, out):
    """2. DistributedGradientTape inside tf.function; an extra head used on some steps only."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(10)])
    aux = tf.keras.layers.Dense(64)
    aux.build((None, 64))
    variables = model.trainable_variables + aux.trainable_variables
    comp = registry.build(method)
    opt = tf.keras.optimizers.SGD(lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb, use_aux):
        with tf.GradientTape() as tape:
            h = tf.cond(use_aux, lambda: aux(xb), lambda: xb)
            loss = loss_fn(yb, model(h))
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        grads = tape.gradient(loss, variables)
        grads = [g if g is not None else tf.zeros_like(v) for g, v in zip(grads, variables)]
        opt.apply_gradients(zip(grads, variables))
        return loss

    hvd.broadcast_variables(variables, root_rank=0)
    ok = steps = 0
    for epoch in range(epochs):
        for i in range(0, len(xs) - 32, 32):
            bs = 32 if steps % 5 else 16  # a second input shape: a retrace
            xb, yb = xs[i:i + bs], ys[i:i + bs]
            train_step(tf.constant(xb), tf.constant(yb), tf.constant((steps + rank) % 3 == 0))
            steps += 1
            ok += identical(variables)
    logits = model(xte)
    out["tape_steps"], out["tape_identical"] = steps, ok
    out["tape_acc"] = float(np.mean(np.argmax(logits.numpy(), 1) == yte))
    out["tape_keys"] = sorted(comp.state_dict()["state"])
    # One batch per step: hvdcomp's steps are the training steps, each holding every gradient.
    # In the traced step: one stateful hvdcomp op (the batch), one stateless op per gradient,
    # and Horovod's per-gradient tf.cond stays stateless (so its allreduces are not serialised).
    specs = (tf.TensorSpec([None, 64]), tf.TensorSpec([None], tf.int64),
             tf.TensorSpec([], tf.bool))
    traced = op_types(train_step.get_concrete_function(*specs).graph, {})
    out["tape_ops"] = {k: traced.get(k, 0) for k in ("PyFunc", "PyFuncStateless", "hvd:If",
                                                     "hvd:StatelessIf", "Switch", "Merge")}
    out["tape_ops"]["conds"] = traced.get("If", 0) + traced.get("StatelessIf", 0)
    out["tape_flushes"], out["tape_elements"] = comp.total_stats.steps, comp.last_stats.elements
    out["tape_decision"] = comp.last_stats.decision
    out["variable_elements"] = sum(int(np.prod(v.shape)) for v in variables)


def keras_case(method, epochs, lr, out):
    """3. Keras model.fit with hvd.keras DistributedOptimizer."""
    tf.keras.utils.set_random_seed(0)
    kmodel = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu",
                                                        input_shape=(64,)),
                                  tf.keras.layers.Dense(10)])
    comp = registry.build(method)
    kmodel.compile(optimizer=hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(lr),
                                                       compression=comp),
                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"])

    class Identical(tf.keras.callbacks.Callback):
        ok = n = 0

        def on_train_batch_end(self, batch, logs=None):
            Identical.n += 1
            Identical.ok += identical(kmodel.trainable_variables)

    kmodel.fit(xs, ys, batch_size=32, epochs=epochs, verbose=0, shuffle=False,
               callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), Identical()])
    out["keras_steps"], out["keras_identical"] = Identical.n, Identical.ok
    out["keras_acc"] = float(kmodel.evaluate(xte, yte, verbose=0)[1])
    out["keras_flushes"] = comp.total_stats.steps
    out["keras_elements"] = comp.last_stats.elements
    out["keras_decision"] = comp.last_stats.decision
    out["keras_variable_elements"] = sum(int(np.prod(v.shape))
                                         for v in kmodel.trainable_variables)


for method, epochs in cases(sys.argv[1:], 2):
    epochs = int(epochs)
    lr, momentum = expect.lr_momentum(method, "tf-test")
    assert momentum == 0, "the TF tests run plain SGD"
    tf.keras.backend.clear_session()  # layer names from 'dense' again
    out = {}
    eager_case(method, out)
    tape_case(method, epochs, lr, out)
    keras_case(method, epochs, lr, out)
    report(case=method, rank=rank, **out)
