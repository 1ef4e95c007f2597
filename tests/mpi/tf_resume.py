"""Rank script: TensorFlow checkpoint/resume. Train N steps with DistributedGradientTape in a
tf.function, checkpoint the model (tf.train.Checkpoint) and the compressor (state_dict(), NumPy),
train M more; then restore both into fresh objects and train the same M steps: the variables
must be bit-identical to the uninterrupted run, and a fresh compressor must diverge.
Args: one or more methods (presets of hvdcomp/registry.py, with the seeds below; SGD at its
"tf-test" rate), run one after the other in this launch; each reports with ``case=method``."""
import hashlib
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402

import hvdcomp  # noqa: E402
from hvdcomp import registry  # noqa: E402
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import expect  # noqa: E402  (tests/expect.py)
from report import report  # noqa: E402

# Test-local arguments on top of the registry preset (other presets: their defaults).
OVERRIDES = {"marsit": dict(seed=5), "binsgdm": dict(seed=3), "topk": dict(seed=3),
             "sketchfusion": dict(seed=3),
             # precondition='adam' (plain SGD inner optimizer): warm-up ends before the checkpoint
             "marsit-adam": dict(seed=5, precondition=hvdcomp.AdamSettings(warmup=3))}
N, M = 5, 5
hvd.init()
rank = hvd.rank()
x = tf.random.stateless_normal([40 * 16, 64], seed=[rank, 7])
y = tf.random.stateless_uniform([40 * 16], seed=[rank, 8], maxval=10, dtype=tf.int64)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build(lr):
    # A restart is a new process: reset Keras' layer-name counters so that the variables get
    # the same names ('dense/kernel:0', ...), which key the compressor state.
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(10)])
    return model, tf.keras.optimizers.SGD(lr)


def trainer(model, opt, comp):
    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb))
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    def run(start, stop):
        for s in range(start, stop):
            step(x[16 * s:16 * (s + 1)], y[16 * s:16 * (s + 1)])
    return run


def digest(model):
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()


def resume_case(method):
    """The fields one method reports (see the module docstring)."""
    lr, momentum = expect.lr_momentum(method, "tf-test")
    assert momentum == 0, "the TF tests run plain SGD"

    def make():
        return registry.build(method, **OVERRIDES.get(method, {}))

    model, opt = build(lr)
    comp = make()
    hvd.broadcast_variables(model.variables, root_rank=0)
    run = trainer(model, opt, comp)
    run(0, N)
    path = os.path.join(tempfile.mkdtemp(), f"ckpt{rank}")
    saved = tf.train.Checkpoint(model=model).write(path)
    comp_state = comp.state_dict()
    run(N, N + M)
    uninterrupted = digest(model)

    def resumed(state):
        model2, opt2 = build(lr)
        tf.train.Checkpoint(model=model2).read(saved).assert_existing_objects_matched()
        comp2 = make()
        comp2.load_state_dict(state)
        trainer(model2, opt2, comp2)(N, N + M)
        return digest(model2)

    return dict(same=resumed(comp_state) == uninterrupted,
                fresh_differs=resumed(make().state_dict()) != uninterrupted,
                keys=sorted(comp_state["state"]), step=comp_state["step"])


assert len(sys.argv) > 1, "one or more methods"
for method in sys.argv[1:]:
    report(case=method, rank=rank, **resume_case(method))
