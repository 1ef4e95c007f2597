"""Rank script (3 ranks): where a step's batch op runs. DistributedGradientTape(process_set=[0, 1])
in a tf.function with a hvdcomp compressor: ranks 0 and 1 reduce their step's batch together;
rank 2, outside the set, gets its own gradients back from Horovod's tf.cond and runs none of
hvdcomp's ops (no hang, no compressor step). Reports per rank: grads (a digest of the 3 steps'
gradients), local (whether they equal this rank's own gradients), steps (the compressor's step
count). Then DistributedOptimizer(backward_passes_per_step=2) over every rank, 4 steps:
aggregated_steps (the compressor's steps: 2, only the steps that reduce) and aggregated_same
(the variables identical across ranks)."""
import hashlib

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402

import hvdcomp  # noqa: E402
from report import report  # noqa: E402

SET = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[SET])
rank = hvd.rank()
variables = [tf.Variable(tf.random.stateless_normal([64, 64], seed=[0, 1]), name="w"),
             tf.Variable(tf.random.stateless_normal([4096], seed=[0, 2]), name="b")]
comp = hvdcomp.Marsit()


def loss_of(x):
    return tf.reduce_sum(x * variables[0]) + tf.reduce_sum(variables[1] * x[0, 0])


@tf.function
def reduced(x):
    with tf.GradientTape() as tape:
        loss = loss_of(x)
    tape = hvd.DistributedGradientTape(tape, compression=comp, process_set=SET)
    return tape.gradient(loss, variables)


digest, local = hashlib.sha256(), True
for step in range(3):
    x = tf.random.stateless_normal([64, 64], seed=[rank, step])
    grads = reduced(x)
    with tf.GradientTape() as tape:
        own = tape.gradient(loss_of(x), variables)
    for g, o in zip(grads, own):
        digest.update(g.numpy().tobytes())
        local &= bool(np.array_equal(g.numpy(), o.numpy()))
out = {"grads": digest.hexdigest(), "local": local, "steps": comp.engine.step}

# backward_passes_per_step=2: Horovod reduces inside its aggregation cond every 2nd step.
comp2 = hvdcomp.Marsit()
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), compression=comp2,
                               backward_passes_per_step=2)


@tf.function
def train(x):
    opt.minimize(lambda: loss_of(x), variables)


for step in range(4):
    train(tf.random.stateless_normal([64, 64], seed=[rank, 10 + step]))
out["aggregated_steps"] = comp2.engine.step
from mpi4py import MPI  # noqa: E402
out["aggregated_same"] = len(set(MPI.COMM_WORLD.allgather(
    b"".join(v.numpy().tobytes() for v in variables)))) == 1
report(rank=rank, **out)
