"""TensorFlow 2.15 + Horovod + hvdcomp on scikit-learn's bundled digits (no download).

    horovodrun -np 4 python examples/train_tf.py --mode tape    # custom loop, DistributedGradientTape
    horovodrun -np 4 python examples/train_tf.py --mode keras   # model.fit, hvd.keras DistributedOptimizer
    horovodrun -np 4 python examples/train_tf.py --mode keras --optimizer adam --lr 1e-3

The only hvdcomp-specific part is the ``compression=`` argument. Checkpointing: the compressor's
``state_dict()`` is plain NumPy; save it beside ``tf.train.Checkpoint`` (shown with --ckpt).
"""
import argparse
import hashlib
import os
import pickle
import sys
import time

import numpy as np
# Horovod's Keras front end needs Keras 2: with TensorFlow >= 2.16 that is tf-keras, which tf.keras
# becomes where this is set before TensorFlow is imported (scripts/setup.sh installs it).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk

import hvdcomp
from digits import load_digits
from hvdcomp import registry
import recipes  # examples/recipes.py: the learning rates

# Horovod's own compressions, then every hvdcomp preset of hvdcomp/registry.py.
CHOICES = ["marsit", "none", "fp16"] + [n for n in registry.PRESETS if n != "marsit"]


def say(msg):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def data(rank, size):
    pixels, labels = load_digits()
    x, y = (pixels / 16.0).astype(np.float32), labels
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(x))
    return (x[:cut][rank::size], y[:cut][rank::size]), (x[cut:], y[cut:])


def make_model():
    return tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                                tf.keras.layers.Dense(256, activation="relu"),
                                tf.keras.layers.Dense(10)])


def parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["tape", "keras"], default="tape")
    ap.add_argument("--compression", choices=CHOICES, default="marsit")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                    help="the Keras optimizer: SGD (with --momentum) or Adam")
    ap.add_argument("--lr", type=float, default=None,
                    help="default: per method (examples/recipes.py, task 'tf-digits', else 'digits')")
    ap.add_argument("--momentum", type=float, default=None, help="default: per method")
    ap.add_argument("--ckpt", default=None, help="write a checkpoint (model + hvdcomp state) here")
    return ap


def train(args, method, seed, lr=None, verbose=True):
    """One training run on the initialised Horovod world; returns {"summary", "curve", "model",
    "compression"}: the summary and the test accuracy after every epoch (the same on every
    rank), and the trained model and the compression (for ``main``'s checkpoint)."""
    tf.keras.utils.set_random_seed(seed)
    (xs, ys), (xte, yte) = data(hvd.rank(), hvd.size())
    built = time.perf_counter()
    if method in ("none", "fp16"):
        compression = getattr(hvd.Compression, method)
    else:
        compression = registry.build(method)
    setup_seconds = time.perf_counter() - built  # the compressor's construction
    lr_default, momentum = recipes.lr_momentum(method, "tf-digits", fallback="digits")
    lr = next(x for x in (lr, args.lr, lr_default) if x is not None)
    momentum = momentum if args.momentum is None else args.momentum
    model = make_model()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = (tf.keras.optimizers.Adam(lr) if args.optimizer == "adam"
           else tf.keras.optimizers.SGD(lr, momentum=momentum))
    curve, t0 = [], time.perf_counter()

    def evaluated(epoch, steps, losses):
        trained = time.perf_counter() - t0  # the seconds to this step, before its evaluation
        acc = float(np.mean(np.argmax(model(xte).numpy(), 1) == yte))
        curve.append({"step": (epoch + 1) * steps, "test_acc": acc,
                      "train_loss": float(np.mean(losses)), "seconds": trained})
        if verbose and hvd.rank() == 0:
            # TensorFlow reduces tensor by tensor: report totals per training step.
            total = getattr(compression, "total_stats", None)
            wire = (f" | sent {total.bytes_sent / ((epoch + 1) * steps) / 1e6:.3f} MB/step/rank, "
                    f"{total.ratio:.1f}x less than an fp32 ring") if total else ""
            say(f"epoch {epoch + 1}/{args.epochs} loss {np.mean(losses):.4f} test acc "
                f"{acc:.4f}{wire}")

    steps = len(range(0, len(xs) - 31, 32))
    if args.mode == "keras":
        model.compile(optimizer=hvdk.DistributedOptimizer(opt, compression=compression),
                      loss=loss_fn, metrics=["accuracy"])
        at_epoch_end = tf.keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: evaluated(epoch, steps, [logs["loss"]]))
        model.fit(xs, ys, batch_size=32, epochs=args.epochs, verbose=0,
                  callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), at_epoch_end])
    else:
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
            evaluated(epoch, steps, [float(step(xs[i:i + 32], ys[i:i + 32]))
                                     for i in range(0, len(xs) - 31, 32)])
    seconds = time.perf_counter() - t0
    h = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.weights)).hexdigest()[:16]
    digests = hvd.allgather_object(h)
    stats = getattr(compression, "total_stats", None)
    numel = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    ring = 2 * (hvd.size() - 1) / hvd.size() * numel * 4
    sent = (stats.bytes_sent + stats.horovod_bytes) / (args.epochs * steps) if stats else (
        ring / 2 if method == "fp16" else ring)
    summary = {"task": "tf-digits", "mode": args.mode, "compression": method, "seed": seed,
               "ranks": hvd.size(), "steps": args.epochs * steps, "epochs": args.epochs,
               "optimizer": args.optimizer, "lr": lr,
               "momentum": momentum if args.optimizer == "sgd" else None,
               "parameters": numel, "metric": "test_acc", "final": curve[-1]["test_acc"],
               "bytes_per_step": sent, "bytes_kind": "measured" if stats else "computed",
               "fp32_ring_bytes_per_step": ring, "seconds": seconds,
               "setup_seconds": setup_seconds, "digests": digests,
               "identical": len(set(digests)) == 1}
    return {"summary": summary, "curve": curve, "model": model, "compression": compression}


def main():
    args = parser().parse_args()
    hvd.init()
    run = train(args, args.compression, 0)
    model, compression = run.pop("model"), run.pop("compression")
    if args.ckpt:
        tf.train.Checkpoint(model=model).write(f"{args.ckpt}.rank{hvd.rank()}")
        if isinstance(compression, hvdcomp.BatchedCompressor):
            with open(f"{args.ckpt}.rank{hvd.rank()}.hvdcomp.pkl", "wb") as fh:
                pickle.dump(compression.state_dict(), fh)
    if hvd.rank() == 0:
        say(f"done: {hvd.size()} ranks, mode={args.mode}, compression={args.compression}, "
            f"test acc {run['summary']['final']:.4f}, weights identical on all ranks: "
            f"{run['summary']['identical']}")


if __name__ == "__main__":
    main()
