"""Soak run: thousands of compressed steps through the stock torch DistributedOptimizer, with the
resident memory of every rank measured after warm-up and at the end.

    mpirun -np 2 --oversubscribe python benchmarks/soak.py --steps 3000 --compression marsit

Prints, for each rank, RSS after the warm-up steps and at the end, and the growth in percent.
"""
import argparse
import os
import sys

import psutil
import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_torch import COMPRESSIONS, load_digits_split, make_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--compression", default="marsit", choices=sorted(COMPRESSIONS))
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    (xtr, ytr), _ = load_digits_split(0)
    model = make_model()
    compression = COMPRESSIONS[args.compression]()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    proc = psutil.Process()
    g = torch.Generator().manual_seed(hvd.rank())
    rss0 = None
    for step in range(args.steps):
        idx = torch.randint(0, len(xtr), (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()
        if step + 1 == args.warmup:
            rss0 = proc.memory_info().rss
    rss1 = proc.memory_info().rss
    rows = hvd.allgather_object((hvd.rank(), rss0, rss1))
    if hvd.rank() == 0:
        for rank, a, b in rows:
            print(f"rank {rank}: {args.steps} steps ({args.compression}), RSS after {args.warmup} "
                  f"steps {a / 2**20:.1f} MiB, at the end {b / 2**20:.1f} MiB, "
                  f"growth {100 * (b - a) / a:+.2f}%", flush=True)


if __name__ == "__main__":
    main()
