"""The training step of the same model in PyTorch and in TensorFlow, without Horovod: what each
framework's own compute costs, the floor under a compressed step (issue #19's TF/PyTorch ratio).

    .venv/bin/python benchmarks/framework_step.py --rounds 3

Model: ``mlp48`` of ``tf_step_bench.py`` / ``train_step_bench.py`` (24 Dense/Linear(1024), ReLU
between, batch 4, SGD), one process, one thread. A step: forward, backward and the SGD update
(PyTorch: ``zero_grad``, ``backward``, ``opt.step()``; TensorFlow: a ``tf.function`` with a
``GradientTape`` and ``apply_gradients``). Each round runs each framework in a fresh process,
alternately; per round the median ms per step over ``--steps`` steps after 3 warm-up steps.
Prints every round and the TF/PyTorch ratio of the medians.
"""
import argparse
import statistics
import subprocess
import sys
import time

BATCH, WIDTH, LAYERS = 4, 1024, 24


def _median_ms(step, steps):
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def torch_step(steps):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for i in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH)] + ([torch.nn.ReLU()] if i < LAYERS - 1 else [])
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, WIDTH, (BATCH,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return _median_ms(step, steps)


def tf_step(steps):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.layers.Dense(WIDTH, activation="relu" if i < LAYERS - 1 else None,
                               input_shape=(WIDTH,) if i == 0 else ()) for i in range(LAYERS)])
    opt = tf.keras.optimizers.SGD(1e-4)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.normal((BATCH, WIDTH))
    y = tf.random.uniform((BATCH,), 0, WIDTH, dtype=tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return _median_ms(lambda: step().numpy(), steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--framework", choices=("torch", "tf"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.framework:  # one measurement, in this process
        print((torch_step if args.framework == "torch" else tf_step)(args.steps))
        return
    results = {"torch": [], "tf": []}
    for r in range(args.rounds):
        for fw in results:
            out = subprocess.run([sys.executable, __file__, "--framework", fw, "--steps",
                                  str(args.steps)], check=True, capture_output=True, text=True)
            results[fw].append(float(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}: PyTorch {results['torch'][-1]:.0f} ms, TensorFlow "
              f"{results['tf'][-1]:.0f} ms per step", flush=True)
    pt, tf = (statistics.median(results[k]) for k in ("torch", "tf"))
    print(f"median: PyTorch {pt:.0f} ms, TensorFlow {tf:.0f} ms, TF/PyTorch {tf / pt:.2f} "
          f"(rounds: {min(results['tf']) / max(results['torch']):.2f}-"
          f"{max(results['tf']) / min(results['torch']):.2f})")


if __name__ == "__main__":
    main()
