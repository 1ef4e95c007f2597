"""Rank script: what a user sees first. One method per job (a fresh process: nothing negotiated,
measured or loaded before its first step), the stock ``hvd.DistributedOptimizer`` with the
method's defaults (decision 'measure'), ``--steps`` steps of ``--model``: ``mlp`` (default; the
25M 2-layer MLP of ``train_step_bench.py``, SGD(lr=1e-4)) or ``resnet18`` (``models.py``, 224
pixels, batch 8, SGD(lr=0.01): Horovod's ``pytorch_synthetic_benchmark.py``), each step's time
the slowest rank's after a barrier. Rank 0 appends one JSON object to ``--out``: the per-step
seconds, the medians of steps 2-6 ("first") and 51-60 ("steady"), the mean of steps 11-14
("benchmark": Horovod's synthetic benchmark times 2 x 2 batches after its 10 warm-up ones), the
decision's floors and what it did not run.

    benchmarks/first_steps.sh RATE OUT            # every method, one job each, on the cluster
    mpirun -np 4 --oversubscribe .venv/bin/python benchmarks/first_steps.py --method Marsit
"""
import argparse
import json
import statistics
import time

from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)

import torch
import horovod.torch as hvd

import models  # this folder
import train_step_bench
from methods import make_compression


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("mlp", "resnet18"), default="mlp")
    ap.add_argument("--method", required=True, help="hvd-fp32, hvd-fp16 or a method's name")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out")
    ap.add_argument("--label", default="")
    ap.add_argument("--round", type=int, default=1)
    args = ap.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(hvd.rank())
    if args.model == "mlp":
        bench, lr = train_step_bench, 1e-4
    else:
        args.image, args.batch = 224, 8
        bench, lr = models, 0.01
    batch = bench.make_batch(args, gen)
    torch.manual_seed(0)
    model = bench.make_model(args) if bench is train_step_bench else models.build(args)
    comp = make_compression(args.method, hvd)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    times = []
    for _ in range(args.steps):
        comm.Barrier()
        t0 = time.perf_counter()
        bench.one_step(model, opt, batch)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if hvd.rank() == 0:
        shown = comp.decision.as_dict() if hasattr(comp, "decision") else {}
        record = {"method": args.method, "model": args.model, "ranks": hvd.size(),
                  "label": args.label, "round": args.round,
                  "times": times, "first": statistics.median(times[1:6]),
                  "steady": statistics.median(times[50:60]) if len(times) >= 60 else None,
                  "benchmark": statistics.mean(times[10:14]) if len(times) >= 14 else None,
                  "floors": shown.get("floors"), "not_run": shown.get("not_run"),
                  "medians": shown.get("medians"), "threshold": str(shown.get("threshold"))}
        print(json.dumps({k: v for k, v in record.items() if k != "times"}), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
