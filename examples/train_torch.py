"""Train a small classifier on scikit-learn's bundled digits (no download) with Horovod and
hvdcomp compression. Launch with several ranks, e.g.

    horovodrun -np 4 python examples/train_torch.py --compression marsit
    mpirun -np 4 python examples/train_torch.py --compression none

The only hvdcomp-specific line is the ``compression=`` argument of hvd.DistributedOptimizer.
Prints progress, the bytes each rank sent per step and, at the end, test accuracy and whether all
ranks hold bit-identical weights.
"""
import argparse
import hashlib
import sys
import time

import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp

COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    "marsit": lambda: hvdcomp.Marsit(),
    "binsgdm": lambda: hvdcomp.BinSGDM(),
    "topk": lambda: hvdcomp.TopK(),
    "sketchfusion": lambda: hvdcomp.SketchFusion(),
}

# Per-method (learning rate, SGD momentum), chosen once for this task. Sign-based methods take
# steps of fixed size per element, so they want smaller rates; BinSGDM carries its own momentum,
# so its inner optimizer is plain SGD.
DEFAULTS = {"none": (0.05, 0.9), "fp16": (0.05, 0.9), "marsit": (0.02, 0.9),
            "binsgdm": (0.002, 0.0), "topk": (0.05, 0.9), "sketchfusion": (0.05, 0.9)}


def load_digits_split(seed=0):
    """The 1797 8x8 digit images, scaled to [0, 1], split 80/20 with a fixed permutation."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    return (x[perm[:cut]], y[perm[:cut]]), (x[perm[cut:]], y[perm[cut:]])


def make_model(hidden=256):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compression", default="marsit", choices=sorted(COMPRESSIONS))
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=None, help="default: per method (DEFAULTS)")
    ap.add_argument("--momentum", type=float, default=None, help="default: per method")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    (xtr, ytr), (xte, yte) = load_digits_split(args.seed)
    shard = torch.arange(hvd.rank(), len(xtr), hvd.size())  # each rank its own slice
    xtr, ytr = xtr[shard], ytr[shard]

    model = make_model()
    compression = COMPRESSIONS[args.compression]()
    lr, momentum = DEFAULTS[args.compression]
    lr = args.lr if args.lr is not None else lr
    momentum = args.momentum if args.momentum is not None else momentum
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    steps_per_epoch = len(xtr) // args.batch_size
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch * 100 + hvd.rank())
        order = torch.randperm(len(xtr), generator=g)
        total = 0.0
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        stats = getattr(compression, "last_stats", None)
        wire = f" | {stats.summary()}" if stats is not None else ""
        if hvd.rank() == 0:
            say(f"epoch {epoch + 1}/{args.epochs} loss {total / steps_per_epoch:.4f} "
                f"test acc {acc:.4f}{wire}")

    digests = hvd.allgather_object(weights_digest(model))
    if hvd.rank() == 0:
        same = len(set(digests)) == 1
        say(f"done: {hvd.size()} ranks, {args.epochs * steps_per_epoch} steps in "
            f"{time.perf_counter() - t0:.1f}s, compression={args.compression}, final test acc "
            f"{acc:.4f}, weights identical on all ranks: {same}")
        if not same:
            raise SystemExit("ranks disagree about the weights")


if __name__ == "__main__":
    main()
