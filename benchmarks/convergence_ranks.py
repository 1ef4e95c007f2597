"""Rank script of benchmarks/convergence.py: runs one example's ``train()`` several times (one
per (method, seed, lr) in ``--runs``) inside a single horovodrun launch, so the launch cost
(interpreters, torch, Horovod, MPI start-up) is paid once per task instead of once per run.

    horovodrun -np 4 ... python benchmarks/convergence_ranks.py --example examples/train_torch.py \
        --out DIR --runs '[["none", 0, null], ["marsit", 0, 0.01]]' -- --epochs 40

Each run builds a fresh model, optimizer and compressor instance (no state carries over). Rank 0
writes ``DIR/<tag>.json`` ({"summary", "curve"} as the example's ``--json``, plus ``wall_s``)
after each run and prints one progress line. A run that hvdcomp refuses (an ``hvdcomp.errors``
exception, raised on every rank: e.g. BinSGDM under SGD with momentum) writes ``{"refused":
message}`` instead, and the next run goes on. The method ``ceiling`` is the example's ``none`` run
with the gradient exchange removed (``hvd.DistributedOptimizer``, and Keras's, return the user's
optimizer as it is: every rank trains alone), whose time is the compute ceiling of the step.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

from hvdcomp import errors
from hvdcomp.errors import HvdcompError


def load_example(path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as when run as a script
    spec = importlib.util.spec_from_file_location("example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports hvdcomp before hvd.init(), as the examples do
    return mod


def init_ranks(mod):
    """Initialise Horovod for the loaded example ``mod`` and give its framework one thread per
    rank; returns its ``hvd``."""
    mod.hvd.init()
    if hasattr(mod, "torch"):
        mod.torch.set_num_threads(1)
    else:  # TensorFlow: one thread per op, as OMP_NUM_THREADS=1 gives torch
        mod.tf.config.threading.set_intra_op_parallelism_threads(1)
    return mod.hvd


def refusal(exc):
    """``'<ErrorName>: message'`` where ``exc`` is an ``hvdcomp.errors`` exception (raised on
    every rank alike), also as TensorFlow re-raises one from a traced function (a StagingError
    whose message holds it); else None."""
    cause = exc
    while cause is not None:
        if isinstance(cause, HvdcompError):
            return f"{type(cause).__name__}: {cause}"
        cause = cause.__cause__ or cause.__context__
    text = str(exc)
    named = [n for n in dir(errors) if n.endswith("Error") and f"{n}: " in text]
    if not named:
        return None
    first = min(named, key=lambda n: text.index(f"{n}: "))
    return first + ": " + text.split(f"{first}: ", 1)[1].strip()


def run_one(mod, ex_args, method, seed, lr):
    """The example's ``train()`` for one (method, seed, lr); ``ceiling``: ``none`` without
    ``hvd.DistributedOptimizer`` (the optimizer as the user built it)."""
    if method != "ceiling":
        rec = mod.train(ex_args, method, seed, lr, verbose=False)
        rec.pop("model", None), rec.pop("compression", None)  # train_tf.py's, for its main()
        return rec
    fronts = [m for m in (mod.hvd, getattr(mod, "hvdk", None)) if m is not None]  # + Keras's
    wraps = [m.DistributedOptimizer for m in fronts]
    for m in fronts:
        m.DistributedOptimizer = lambda optimizer, **kwargs: optimizer
    try:
        rec = mod.train(ex_args, "none", seed, lr, verbose=False)
        rec.pop("model", None), rec.pop("compression", None)
    finally:
        for m, wrap in zip(fronts, wraps):
            m.DistributedOptimizer = wrap
    rec["summary"].update(compression="ceiling", bytes_per_step=0.0, identical=True)
    return rec


def tag_of(task, method, seed, lr):
    return f"{task}-{method}-s{seed}" + (f"-lr{lr:g}" if lr is not None else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", required=True, help="JSON list of [method, seed, lr or null]")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the example's options")
    args = ap.parse_args()
    mod = load_example(args.example)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    ex_args = mod.parser().parse_args(rest)
    hvd = init_ranks(mod)
    runs = json.loads(args.runs)
    for i, (method, seed, lr) in enumerate(runs):
        t0 = time.perf_counter()
        tag = tag_of(args.task, method, seed, lr)
        try:
            rec = run_one(mod, ex_args, method, int(seed), lr)
        except Exception as exc:  # noqa: BLE001 - an hvdcomp refusal is reported, others raise
            why = refusal(exc)
            if why is None:
                raise
            if hvd.rank() == 0:
                with open(os.path.join(args.out, tag + ".json"), "w") as fh:
                    json.dump({"refused": why}, fh)
                sys.stdout.write(f"[{i + 1}/{len(runs)}] {tag}: refused ({why.split(':')[0]})\n")
                sys.stdout.flush()
            continue
        rec["wall_s"] = time.perf_counter() - t0
        if hvd.rank() == 0:
            s = rec["summary"]
            with open(os.path.join(args.out, tag + ".json"), "w") as fh:
                json.dump(rec, fh, indent=1)
            sys.stdout.write(
                f"[{i + 1}/{len(runs)}] {tag}: {s['metric']} {s['final']:.4f}, "
                f"{s['bytes_per_step'] / 1e3:.1f} kB/step ({s['bytes_kind']}), identical "
                f"{s['identical']}, {s['seconds']:.1f}s training\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
