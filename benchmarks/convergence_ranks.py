"""Rank script of benchmarks/convergence.py: runs one example's ``train()`` several times (one
per (method, seed, lr) in ``--runs``) inside a single horovodrun launch, so the launch cost
(interpreters, torch, Horovod, MPI start-up) is paid once per task instead of once per run.

    horovodrun -np 4 ... python benchmarks/convergence_ranks.py --example examples/train_torch.py \
        --out DIR --runs '[["none", 0, null], ["marsit", 0, 0.01]]' -- --epochs 40

Each run builds a fresh model, optimizer and compressor instance (no state carries over). Rank 0
writes ``DIR/<tag>.json`` ({"summary", "curve"} as the example's ``--json``, plus ``wall_s``)
after each run and prints one progress line.
"""
import argparse
import importlib.util
import json
import os
import sys
import time


def load_example(path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as when run as a script
    spec = importlib.util.spec_from_file_location("example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports hvdcomp before hvd.init(), as the examples do
    return mod


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
    hvd = mod.hvd
    hvd.init()
    mod.torch.set_num_threads(1)
    runs = json.loads(args.runs)
    for i, (method, seed, lr) in enumerate(runs):
        t0 = time.perf_counter()
        rec = mod.train(ex_args, method, int(seed), lr, verbose=False)
        rec["wall_s"] = time.perf_counter() - t0
        if hvd.rank() == 0:
            s = rec["summary"]
            tag = tag_of(args.task, method, seed, lr)
            with open(os.path.join(args.out, tag + ".json"), "w") as fh:
                json.dump(rec, fh, indent=1)
            sys.stdout.write(
                f"[{i + 1}/{len(runs)}] {tag}: {s['metric']} {s['final']:.4f}, "
                f"{s['bytes_per_step'] / 1e3:.1f} kB/step ({s['bytes_kind']}), identical "
                f"{s['identical']}, {s['seconds']:.1f}s training\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
