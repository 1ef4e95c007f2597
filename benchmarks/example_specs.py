"""One example's training (examples/train_torch.py, train_charlm.py or train_tf.py) under each
compression spec, in one launch: final quality, bytes per step and ms per step per spec.

    mpirun -np 4 --oversubscribe --bind-to none .venv/bin/python benchmarks/example_specs.py \\
        train_torch none "Marsit@decision='pass'" marsit -- --epochs 10 --batch-size 16 --lr 0.1 --momentum 0

A spec is a name of the example's ``COMPRESSIONS`` (Horovod's 'none'/'fp16', a registry preset)
or ``Class@key=value@...`` with Python literals (``"SketchFusion@ratio=0.1@rows=1"``); a
class spec trains with the example's default optimizer and rate for Marsit unless the example's
options set them. SEEDS=0,1,2 runs each spec per seed (default 0). Rank 0 prints one line per run.
"""
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
from hvdcomp import registry  # noqa: E402
from methods import parse_spec  # noqa: E402


def main():
    cut = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    example = importlib.import_module(sys.argv[1])
    specs, rest = sys.argv[2:cut], sys.argv[cut + 1:]
    for spec in specs:
        if spec not in example.COMPRESSIONS:
            name, kwargs = parse_spec(spec)
            example.COMPRESSIONS[spec] = (lambda cls=registry.METHODS[name], kw=kwargs: cls(**kw))
            example.DEFAULTS[spec] = example.DEFAULTS["marsit"]
    example.hvd.init()
    if hasattr(example, "torch"):
        example.torch.set_num_threads(1)
    args = example.parser().parse_args(rest)
    for spec in specs:
        for seed in (int(s) for s in os.environ.get("SEEDS", "0").split(",")):
            s = example.train(args, spec, seed, verbose=False)["summary"]
            if example.hvd.rank() == 0:
                print(f"{spec} seed {seed}: final {s['final']:.4f}, {s['bytes_per_step'] / 1e3:.1f} "
                      f"kB/step, ranks identical {s['identical']}, {s['seconds']:.2f} s, "
                      f"{1e3 * s['seconds'] / s['steps']:.2f} ms/step", flush=True)


if __name__ == "__main__":
    main()
