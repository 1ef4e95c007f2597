"""LayerFusion vs layer-wise compression vs one bucket per step, in real training steps.

    source scripts/mpi_env.sh
    timeout 900 mpirun -np 4 --oversubscribe --bind-to none .venv/bin/python \\
        benchmarks/fusion_bench.py [--steps 5] [--rounds 3]

A model with many small layers and a few large ones (2 large 256x1024 / 1024x256 linears, two
64k-element linears, 24 small 64x64 linears: 56 gradient tensors, 0.8 M parameters) is trained
with the stock ``horovod.torch.DistributedOptimizer`` (SGD) on random data, for each compressor
(every method of hvdcomp/registry.py, default settings) with three ``fusion=`` settings of the
same compressor: 'layerwise' (one bucket per tensor, reduced as soon as it is ready), 'auto'
(LayerFusion: buckets planned from the measured backward timing and the compressor's own timed
reductions) and 'step' (one batch per step at the first decompress: no overlap). Each setting
has its own model, optimizer and compressor; after warm-up steps (LayerFusion plans after its
third step), the settings take turns (``--rounds`` rounds of ``--steps`` steps each, so machine
load hits all of them alike). Printed per setting: the median over rounds of the per-step wall
time (slowest rank), the number of buckets, and for 'auto' the plan chosen. Times on a loaded or
oversubscribed machine are indicative only.
"""
import argparse
import os
import statistics
import sys
import time

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdcomp  # noqa: E402  (before horovod: mpi4py owns MPI, see hvdcomp.comm.context)
from hvdcomp import registry  # noqa: E402
import horovod.torch as hvd  # noqa: E402

MODES = ("layerwise", "auto", "step")
COMPRESSORS = {m: (lambda f, cls=cls: cls(fusion=f)) for m, cls in registry.METHODS.items()}
WARMUP = 4


def make_model():
    layers = [torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64)]
    for _ in range(24):
        layers += [torch.nn.ReLU(), torch.nn.Linear(64, 64)]
    layers += [torch.nn.ReLU(), torch.nn.Linear(64, 1024), torch.nn.ReLU(),
               torch.nn.Linear(1024, 256)]
    return torch.nn.Sequential(*layers)


class Setting:
    """One model + optimizer + compressor."""

    def __init__(self, comp):
        torch.manual_seed(0)
        self.comp, self.model = comp, make_model()
        opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.opt = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters(),
                                            compression=comp)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(hvd.rank())
        self.x, self.y = torch.randn(64, 256, generator=gen), torch.randn(64, 256, generator=gen)

    def steps(self, n):
        """Mean seconds per step over ``n`` steps (the slowest rank's)."""
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            self.opt.zero_grad()
            torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
            self.opt.step()
        return MPI.COMM_WORLD.allreduce((time.perf_counter() - t0) / n, op=MPI.MAX)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compressors", default=",".join(COMPRESSORS))
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    say = print if hvd.rank() == 0 else (lambda *a, **k: None)
    n_params = sum(p.numel() for p in make_model().parameters())
    say(f"{hvd.size()} ranks, model: {len(list(make_model().parameters()))} tensors, "
        f"{n_params / 1e6:.2f} M parameters; {args.rounds} rounds x {args.steps} steps per setting")
    for name in args.compressors.split(","):
        settings = {m: Setting(COMPRESSORS[name](m)) for m in MODES}
        for s in settings.values():
            s.steps(WARMUP)
        times = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for m, s in settings.items():
                times[m].append(s.steps(args.steps))
        for m, s in settings.items():
            plan = s.comp.fusion_plan
            buckets = len(plan["buckets"]) if plan else 1
            say(f"{name:12s} fusion={m:9s} {statistics.median(times[m]) * 1e3:8.1f} ms/step "
                f"(rounds: {', '.join(f'{t * 1e3:.1f}' for t in times[m])})  buckets {buckets:3d}")
        say(f"{name:12s} plan: {settings['auto'].comp.describe_fusion()}")
        say(f"{name:12s} buckets (tensors each): "
            f"{[len(b) for b in settings['auto'].comp.fusion_plan['buckets']]}", flush=True)


if __name__ == "__main__":
    main()
