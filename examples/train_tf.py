"""TensorFlow 2.15 + Horovod + hvdcomp on scikit-learn's bundled digits (no download).

    horovodrun -np 4 python examples/train_tf.py --mode tape    # custom loop, DistributedGradientTape
    horovodrun -np 4 python examples/train_tf.py --mode keras   # model.fit, hvd.keras DistributedOptimizer

The only hvdcomp-specific part is the ``compression=`` argument. Checkpointing: the compressor's
``state_dict()`` is plain NumPy; save it beside ``tf.train.Checkpoint`` (shown with --ckpt).
"""
import argparse
import pickle
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk

import hvdcomp
from hvdcomp import registry

# Horovod's own compressions, then every hvdcomp preset of hvdcomp/registry.py.
CHOICES = ["marsit", "none", "fp16"] + [n for n in registry.PRESETS if n != "marsit"]


def say(msg):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def data(rank, size):
    from sklearn.datasets import load_digits
    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(x))
    return (x[:cut][rank::size], y[:cut][rank::size]), (x[cut:], y[cut:])


def make_model():
    return tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                                tf.keras.layers.Dense(256, activation="relu"),
                                tf.keras.layers.Dense(10)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["tape", "keras"], default="tape")
    ap.add_argument("--compression", choices=CHOICES, default="marsit")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=None,
                    help="default: per method (hvdcomp.registry, task 'tf-digits', else 'digits')")
    ap.add_argument("--momentum", type=float, default=None, help="default: per method")
    ap.add_argument("--ckpt", default=None, help="write a checkpoint (model + hvdcomp state) here")
    args = ap.parse_args()
    hvd.init()
    tf.keras.utils.set_random_seed(0)
    (xs, ys), (xte, yte) = data(hvd.rank(), hvd.size())
    if args.compression in ("none", "fp16"):
        compression = getattr(hvd.Compression, args.compression)
    else:
        compression = registry.build(args.compression)
    lr, momentum = registry.lr_momentum(args.compression, "tf-digits", fallback="digits")
    lr = lr if args.lr is None else args.lr
    momentum = momentum if args.momentum is None else args.momentum
    model = make_model()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if args.mode == "keras":
        opt = tf.keras.optimizers.SGD(lr, momentum=momentum)
        model.compile(optimizer=hvdk.DistributedOptimizer(opt, compression=compression),
                      loss=loss_fn, metrics=["accuracy"])
        model.fit(xs, ys, batch_size=32, epochs=args.epochs, verbose=0,
                  callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    else:
        opt = tf.keras.optimizers.SGD(lr, momentum=momentum)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        model(xs[:1])
        hvd.broadcast_variables(model.variables, root_rank=0)
        for epoch in range(args.epochs):
            losses = [float(step(xs[i:i + 32], ys[i:i + 32])) for i in range(0, len(xs) - 31, 32)]
            if hvd.rank() == 0:
                # TensorFlow reduces tensor by tensor: report totals per training step.
                total = getattr(compression, "total_stats", None)
                steps = (epoch + 1) * len(losses)
                wire = (f" | sent {total.bytes_sent / steps / 1e6:.3f} MB/step/rank, "
                        f"{total.ratio:.1f}x less than an fp32 ring") if total else ""
                say(f"epoch {epoch + 1}/{args.epochs} loss {np.mean(losses):.4f}{wire}")
    acc = float(np.mean(np.argmax(model(xte).numpy(), 1) == yte))
    if args.ckpt:
        tf.train.Checkpoint(model=model).write(f"{args.ckpt}.rank{hvd.rank()}")
        if isinstance(compression, hvdcomp.BatchedCompressor):
            with open(f"{args.ckpt}.rank{hvd.rank()}.hvdcomp.pkl", "wb") as fh:
                pickle.dump(compression.state_dict(), fh)
    if hvd.rank() == 0:
        say(f"done: {hvd.size()} ranks, mode={args.mode}, compression={args.compression}, "
            f"test acc {acc:.4f}")


if __name__ == "__main__":
    main()
