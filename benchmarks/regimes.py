"""Rank script: training throughput on real model shapes at one link rate, every method against
Horovod fp32 / fp16 and the compute ceiling, from one job (issue #31).

    benchmarks/regimes.sh                      # the emulated cluster, every rate and model
    mpirun -np 4 --oversubscribe .venv/bin/python benchmarks/regimes.py --model resnet18

Models, written here (torchvision's wheel does not load beside this CPU torch):
- ``resnet18``: torchvision's ResNet-18 architecture (BasicBlock [2, 2, 2, 2], 1000 classes,
  11.7M parameters in 62 tensors), as Horovod's ``pytorch_synthetic_benchmark.py``: synthetic
  images (``--image`` pixels square, default 224 as Horovod's benchmark; the parameter shapes,
  which set the traffic, do not depend on it, but the computation per parameter does, and with
  it the share of a step that hvdcomp's codec takes: at 64 pixels, what this benchmark ran until
  2026-12-05 to keep a CPU step short, a step computes 12x less against the same codec work, so its
  fractions of the ceiling understated what a user's 224-pixel job sees), batch ``--batch`` (8)
  per rank, SGD(lr 0.01).
- ``resnet50``: the same with Bottleneck [3, 4, 6, 3] (25.6M parameters in 161 tensors).
- ``gpt``: a GPT-style causal transformer LM (``--layers`` 8, d_model 512, 8 heads, feed-forward
  2048, vocabulary 8192, learned positions, tied output; ~30M parameters in ~100 tensors),
  sequences of ``--seq`` (64) tokens, batch ``--batch``, AdamW(lr 1e-4): the user's optimizer,
  kept (hvdcomp follows or sets its moments: docs/methods.md, "With Adam or AdamW").

Configurations (``--methods``): ``ceiling`` (the user's optimizer alone, no exchange: every rank
trains on the same shared cores, so this is the step with the gradient exchange removed),
``hvd-fp32`` / ``hvd-fp16`` (Horovod's own compression), and every hvdcomp method with its
defaults (the bare class's settings: compress-or-pass decision 'measure', ``hvdcomp.decision``),
each through the stock ``hvd.DistributedOptimizer``. All are built at once (same seed), warmed
up and timed in interleaved rounds (``rounds.measure``: hvdcomp's warm up until its decision
holds a choice; a step is the slowest rank's seconds after a barrier). ``--sequential``: one
configuration at a time, each beside the ceiling (``rounds.measure_paired``), for models whose
configurations do not fit in memory together (gpt with AdamW): a drift of the machine between
configurations, which one ceiling taken first does not see (gpt's CPU steps drifted by
1.2-1.8x), then cancels. Also measured: Horovod's fp32 allreduce of a tensor of the model's size
(median of 3), so ``r = allreduce / ceiling step``. Rank 0 prints and appends one JSON object
per configuration to ``--out`` (``rounds.write``).
"""
import argparse

from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)

import torch
import horovod.torch as hvd

import rounds  # this folder
from methods import make_compression
import models
from models import build, make_batch, user_optimizer


class Config(models.Trained):
    """One configuration's model, optimizer (the user's, wrapped by the stock
    ``hvd.DistributedOptimizer`` but for the ceiling) and compressor."""

    def __init__(self, args, method):
        model = build(args)
        opt = user_optimizer(args, model)
        comp = None if method == "ceiling" else make_compression(method, hvd)
        if comp is not None:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           compression=comp)
        super().__init__(method, comp, model, opt)


def main():
    ap = argparse.ArgumentParser()
    models.add_args(ap)
    rounds.add_args(ap)
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD.Dup()
    batch = make_batch(args, torch.Generator().manual_seed(hvd.rank()))
    model = build(args)
    params = sum(p.numel() for p in model.parameters())
    job = {"model": args.model, "ranks": hvd.size(), "hosts": hvd.cross_size(), "params": params,
           "tensors": sum(1 for _ in model.parameters()), "batch": args.batch}
    del model
    ones = torch.ones(params)
    job["allreduce_seconds"] = rounds.allreduce_seconds(
        comm, lambda: hvd.allreduce(ones, name="regimes.probe", op=hvd.Sum))
    del ones
    rounds.run(args, comm, batch, lambda m: Config(args, m), job)


if __name__ == "__main__":
    main()
