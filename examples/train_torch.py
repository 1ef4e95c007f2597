"""Train a small classifier on scikit-learn's bundled digits (no download) with Horovod and
hvdcomp compression. Launch with several ranks, e.g.

    horovodrun -np 4 python examples/train_torch.py --compression marsit
    mpirun -np 4 python examples/train_torch.py --compression none

The only hvdcomp-specific line is the ``compression=`` argument of hvd.DistributedOptimizer.
Prints progress, the bytes each rank sent per step and, at the end, test accuracy and whether all
ranks hold bit-identical weights. ``--json FILE`` writes the per-epoch curve and the summary as JSON
(rank 0; benchmarks/convergence.py reads it).
"""
import argparse
import hashlib
import json
import sys
import time

import numpy as np
import torch
import horovod.torch as hvd

from digits import load_digits
from hvdcomp import registry
import recipes  # examples/recipes.py: the learning rates

# Horovod's own compressions, then every hvdcomp preset of hvdcomp/registry.py (e.g. 'marsit',
# 'marsit-global': the paper's memory, 'marsit-rms'/'-adam': precondition='rms'/'adam').
COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    **{name: (lambda name=name: registry.build(name)) for name in registry.PRESETS},
}

# Per-method (learning rate, SGD momentum) for this task ("digits" in examples/recipes.py),
# chosen once by the equal-effort sweep in benchmarks/convergence_tuning.md (40 epochs, 4 ranks)
# and used for every seed. Sign-based methods take steps of fixed size per element, so they want
# smaller rates; BinSGDM carries its own momentum, so its inner optimizer is plain SGD.
DEFAULTS = {name: recipes.lr_momentum(name, "digits") for name in COMPRESSIONS}


def load_digits_split(seed=0):
    """The 1797 8x8 digit images, scaled to [0, 1], split 80/20 with a fixed permutation."""
    pixels, labels = load_digits()
    x = torch.tensor(pixels / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    return (x[perm[:cut]], y[perm[:cut]]), (x[perm[cut:]], y[perm[cut:]])


def make_model(kind="mlp", hidden=256):
    """'mlp': 64-256-256-10 (83k parameters); 'cnn': two 3x3 convolutions (16, 32 channels) on
    the 8x8 image, a 2x2 max-pool, then 512-64-10 (38k parameters)."""
    if kind == "cnn":
        return torch.nn.Sequential(
            torch.nn.Unflatten(1, (1, 8, 8)),
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Flatten(),
            torch.nn.Linear(512, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


def say(msg):
    """Print one line in a single write, so launcher-tagged output lines never interleave."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def weights_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def bytes_per_step(compression, name, numel, size):
    """(bytes this rank sent per step, 'measured' | 'computed'). hvdcomp methods count their own
    MPI traffic (plus the ring equivalent of the small tensors Horovod sums for them); Horovod's
    none/fp16 get the ring all-reduce equivalent 2(P-1)/P * numel * width."""
    stats = getattr(compression, "total_stats", None)
    if stats is not None and stats.steps:
        return (stats.bytes_sent + stats.horovod_bytes) / stats.steps, "measured"
    width = 2 if name == "fp16" else 4
    return 2 * (size - 1) / size * numel * width, "computed"


def parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compression", default="marsit", choices=sorted(COMPRESSIONS))
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=None, help="default: per method (DEFAULTS)")
    ap.add_argument("--momentum", type=float, default=None, help="default: per method")
    ap.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                    help="learning rate over the run: constant, or cosine decay to 0 (per step)")
    ap.add_argument("--seed", type=int, default=0, help="model init, data order and test split")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="write the curve and summary as JSON here (rank 0)")
    return ap


def train(args, method, seed, lr=None, momentum=None, verbose=True):
    """One training run on the initialised Horovod world; returns {"summary", "curve"} (the
    same on every rank, except that only rank 0 prints)."""
    torch.manual_seed(seed)
    (xtr, ytr), (xte, yte) = load_digits_split(seed)
    shard = torch.arange(hvd.rank(), len(xtr), hvd.size())  # each rank its own slice
    xtr, ytr = xtr[shard], ytr[shard]

    model = make_model(getattr(args, "model", "mlp"))
    numel = sum(p.numel() for p in model.parameters())
    built = time.perf_counter()
    compression = COMPRESSIONS[method]()
    setup_seconds = time.perf_counter() - built  # the compressor's construction
    # the rate: this call's, else the command line's, else the method's default
    lr = next(x for x in (lr, args.lr, DEFAULTS[method][0]) if x is not None)
    momentum = next(x for x in (momentum, args.momentum, DEFAULTS[method][1]) if x is not None)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    steps_per_epoch = len(xtr) // args.batch_size
    schedule = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs * steps_per_epoch)
                if getattr(args, "schedule", "constant") == "cosine" else None)
    t0 = time.perf_counter()
    curve = []
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(seed * 1000 + epoch * 100 + hvd.rank())
        order = torch.randperm(len(xtr), generator=g)
        total = 0.0
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            if schedule is not None:
                schedule.step()
            total += loss.item()
        trained = time.perf_counter() - t0  # the seconds to this step, before its evaluation
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        stats = getattr(compression, "last_stats", None)
        wire = f" | {stats.summary()}" if stats is not None else ""
        curve.append({"step": (epoch + 1) * steps_per_epoch, "test_acc": acc,
                      "train_loss": total / steps_per_epoch, "seconds": trained,
                      "bytes_per_step": bytes_per_step(compression, method, numel, hvd.size())[0]})
        if verbose and hvd.rank() == 0:
            say(f"epoch {epoch + 1}/{args.epochs} loss {total / steps_per_epoch:.4f} "
                f"test acc {acc:.4f}{wire}")

    seconds = time.perf_counter() - t0
    digests = hvd.allgather_object(weights_digest(model))
    sent, kind = bytes_per_step(compression, method, numel, hvd.size())
    summary = {"task": "digits", "model": getattr(args, "model", "mlp"), "compression": method, "seed": seed, "ranks": hvd.size(),
               "steps": args.epochs * steps_per_epoch, "epochs": args.epochs, "optimizer": "sgd",
               "lr": lr, "momentum": momentum, "batch_size": args.batch_size,
               "parameters": numel, "metric": "test_acc", "final": acc,
               "bytes_per_step": sent, "bytes_kind": kind,
               "fp32_ring_bytes_per_step": 2 * (hvd.size() - 1) / hvd.size() * numel * 4,
               "seconds": seconds, "setup_seconds": setup_seconds, "digests": digests,
               "identical": len(set(digests)) == 1}
    return {"summary": summary, "curve": curve}


def main():
    args = parser().parse_args()
    hvd.init()
    torch.set_num_threads(1)
    run = train(args, args.compression, args.seed, args.lr, args.momentum)
    s = run["summary"]
    if hvd.rank() == 0:
        say(f"done: {s['ranks']} ranks, {s['steps']} steps in {s['seconds']:.1f}s, "
            f"compression={s['compression']} (lr {s['lr']:g}, momentum {s['momentum']:g}), "
            f"final test acc {s['final']:.4f}, {s['bytes_per_step'] / 1e3:.1f} kB/step/rank "
            f"sent ({s['bytes_kind']}), weights identical on all ranks: {s['identical']}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(run, fh, indent=1)
        if not s["identical"]:
            raise SystemExit("ranks disagree about the weights")


if __name__ == "__main__":
    main()
