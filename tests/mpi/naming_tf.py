"""Rank script: tensor naming with horovod.tensorflow (hvdcomp.facade.frontends.naming).

DistributedGradientTape inside tf.function, default path, ``num_groups=2`` and ``groups=``, and
the Keras DistributedOptimizer, 3 steps each with TopK on every tensor: the compressor's state
keys are the variable names (two variables that TensorFlow hands one and the same gradient
tensor keep two keys); the identities carry the variable, the tape/optimizer and the process
set. Eager hvd.allreduce / grouped_allreduce / hvd.keras.allreduce with ``name=`` keep separate state (a second call
on zeros returns zeros); without ``name=``, eager and inside tf.function, they raise
UnnamedTensorError (reported per rank)."""
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from mpi4py import MPI  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvdk  # noqa: E402

import hvdcomp  # noqa: E402
from hvdcomp.facade.frontends import tensorflow as adapter  # noqa: E402
from report import report  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
seen = []  # every Identity the adapter returned (at trace time)
_lookup = adapter.tensor_identity


def recording(tensor, method):
    identity = _lookup(tensor, method)
    seen.append(identity)
    return identity


adapter.tensor_identity = recording


def identical(variables):
    digests = MPI.COMM_WORLD.allgather(b"".join(v.numpy().tobytes() for v in variables))
    return len(set(digests)) == 1


def tape_run(mode):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(20,)),
                                 tf.keras.layers.Dense(4)])
    u = tf.Variable(tf.ones([4]), name="u")  # u and v get one and the same gradient tensor
    v = tf.Variable(tf.ones([4]), name="v")
    variables = model.trainable_variables + [u, v]
    kw = {"default": {}, "num_groups": {"num_groups": 2},
          "groups": {"groups": [[variables[0], variables[3]], [variables[1], u]]}}[mode]
    comp = hvdcomp.TopK(min_compress_numel=1, ratio=0.25)
    opt = tf.keras.optimizers.SGD(0.1)
    tapes = []

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x) + (u + v)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, compression=comp, **kw)
        tapes.append(tape)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    hvd.broadcast_variables(variables, root_rank=0)
    seen.clear()
    for s in range(3):
        rng = np.random.default_rng([s, rank])
        step(tf.constant(rng.standard_normal((8, 20)), tf.float32),
             tf.constant(rng.integers(0, 4, 8)))
    by_name = {var.name: var for var in variables}
    right = all(by_name[i.name] is i.owner and any(i.optimizer is t for t in tapes)
                and i.process_set is hvd.global_process_set for i in seen)
    return {"keys": sorted(comp.state_dict()["state"]), "names": sorted(by_name),
            "identities": len(seen), "owners_right": right, "identical": identical(variables)}


def keras_run():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(20,)),
                                 tf.keras.layers.Dense(4)])
    comp = hvdcomp.TopK(min_compress_numel=1, ratio=0.25)
    opt = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=comp, num_groups=2)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(True))
    rng = np.random.default_rng(rank)
    seen.clear()
    model.fit(rng.standard_normal((24, 20)).astype(np.float32), rng.integers(0, 4, 24),
              batch_size=8, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    names = sorted(var.name for var in model.trainable_variables)
    return {"keys": sorted(comp.state_dict()["state"]), "names": names,
            "optimizer_right": all(i.optimizer is opt for i in seen) and len(seen) > 0,
            "identical": identical(model.trainable_variables)}


def error_of(fn):
    try:
        fn()
    except hvdcomp.UnnamedTensorError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


out = {mode: tape_run(mode) for mode in ("default", "num_groups", "groups")}
out["keras"] = keras_run()
g = tf.random.stateless_normal([4096], seed=[rank, 1])
comp = hvdcomp.TopK()
first = hvd.allreduce(g, name="direct.a", compression=comp)
second = hvd.allreduce(tf.zeros([4096]), name="direct.zeros", compression=comp)
hvd.grouped_allreduce([g, 2 * g], name="grp", compression=comp)
hvdk.allreduce(g, name="keras.g", compression=comp)  # names the constant it passes on
out["direct"] = {"first_nonzero": int(tf.math.count_nonzero(first)),
                 "zeros_max": float(tf.reduce_max(tf.abs(second))),
                 "keys": sorted(comp.state_dict()["state"])}
out["unnamed_eager"] = error_of(lambda: hvd.allreduce(g, compression=hvdcomp.Marsit()))
traced = tf.function(lambda x: hvd.allreduce(x * 2, compression=hvdcomp.Marsit()))
out["unnamed_function"] = error_of(lambda: traced.get_concrete_function(g))
report(rank=rank, **out)
