"""Rank script: the compress-or-pass decision (mode 'measure', set by the test) on a slow link of
the emulated cluster, through the stock hvd.DistributedOptimizer(SGD) on the digits MLP.

Args: compressions (e.g. ``marsit topk``), run one after the other. For each: STEPS steps,
recording per step the candidate in force (its threshold, 'fp16' for the float16 pass), whether
the parameters are bit-identical across ranks and their digest; a checkpoint (model, optimizer,
compressor) after step SAVE; then a fresh model, optimizer and compressor load it and run the
steps after SAVE again, recording the same. Also the decision's floors and what it did not run.
"""
import io
import sys

import torch
import horovod.torch as hvd

from report import report
from torch_common import (batch, build, compression_for, compressor_object, digest,
                          identical_across_ranks, load_digits_split)

STEPS, SAVE, LR = 30, 20, 0.05
hvd.init()
(xtr, ytr), _ = load_digits_split(0)


def run(model, opt, comp, start, stop):
    steps = []
    for i in range(start, stop):
        d = comp.decision
        steps.append("fp16" if d.passes_half() else str(d.threshold))
        xb, yb = batch(xtr, ytr, i, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        steps[-1] = (steps[-1], identical_across_ranks(model), digest(model))
    return steps


def case(name):
    comp_arg = compression_for(name)
    model, opt = build(comp_arg, LR, 0.0)
    comp = compressor_object(comp_arg)
    first = run(model, opt, comp, 0, SAVE)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "comp": comp.state_dict()}, saved)
    rest = run(model, opt, comp, SAVE, STEPS)
    shown = comp.decision.as_dict()
    saved.seek(0)
    resumed_arg = compression_for(name)
    model, opt = build(resumed_arg, LR, 0.0, state=torch.load(saved, weights_only=False))
    resumed = run(model, opt, compressor_object(resumed_arg), SAVE, STEPS)
    return dict(case=name, steps=first + rest, resumed=resumed, phase=shown["phase"],
                floors=shown.get("floors"), not_run=shown.get("not_run"), medians=shown["medians"])


results = [case(name) for name in sys.argv[1:]]
report(rank=hvd.rank(), results=results)
