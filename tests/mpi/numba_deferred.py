"""Rank script (2 ranks): a job that passes every gradient never loads numba
(``hvdcomp.engine.KernelLoading``). The digits MLP trains through the stock
hvd.DistributedOptimizer(SGD): PowerSGD (no kernels of its own) 20 steps with
``decision='pass', on_nonfinite='skip'``, so that hvdcomp checks every tensor Horovod sums at
every step (NumPy's check, numba not loaded), rank 1's batch holding a NaN at step NAN_STEP;
then Marsit (whose kernels its constructor loaded until 2026-12-01) 20 steps with
``decision='pass'``; then Marsit with ``decision='compress'`` (compressing for good from its
first step) 4 steps. Reports per run: the steps that ended bit-identical on every rank, the
steps skipped, whether numba was imported after it, and which kernels were loaded."""
import sys

import torch
import horovod.torch as hvd

import hvdcomp
from hvdcomp import kernels

from report import report
from torch_common import batch, build, identical_across_ranks, load_digits_split

NAN_STEP = 8
hvd.init()
(x, y), _ = load_digits_split(0)


def run(compression, steps, nan_step=None):
    model, opt = build(compression, lr=0.1, momentum=0.0)
    identical = 0
    for step in range(steps):
        xb, yb = batch(x, y, step, hvd.rank())
        if step == nan_step and hvd.rank() == 1:
            xb = xb.clone()
            xb[0, 0] = float("nan")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        identical += identical_across_ranks(model)
    return {"identical": identical, "skipped": compression.state_dict()["skipped"],
            "numba": "numba" in sys.modules,
            "loaded": [m for m in ("finite", "topk", "hvdcomp.signs.kernels",
                                       "hvdcomp.methods.binsgdm.kernels",
                                       "hvdcomp.methods.sketchfusion.kernels")
                       if kernels.ready(m)]}


out = {"powersgd-pass": run(hvdcomp.PowerSGD(decision="pass", on_nonfinite="skip"), 20, NAN_STEP),
       "marsit-pass": run(hvdcomp.Marsit(decision="pass"), 20),
       "marsit-compress": run(hvdcomp.Marsit(decision="compress"), 4)}
report(rank=hvd.rank(), **out)
