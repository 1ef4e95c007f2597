"""Rank script: BinSGDM through the stock hvd.DistributedOptimizer on whatever layout the launch
gives (HVDCOMP_RANKS_PER_NODE set by the test): a few steps of a small model with ranks
bit-identical after every step, the layout BinSGDM chose (and its warning, on rank 0), per-leg
bytes of one direct all-reduce, and what ``uneven='error'`` does. Arg: steps."""
import sys
import warnings

import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, identical_across_ranks, load_digits_split, make_model

steps = int(sys.argv[1])
hvd.init()
(xtr, ytr), _ = load_digits_split(0)
torch.manual_seed(0)
model = make_model(hidden=32)
comp = hvdcomp.BinSGDM()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(), compression=comp)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
identical = 0
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for step in range(steps):
        xb, yb = batch(xtr, ytr, step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        identical += identical_across_ranks(model)
trained_through_compressor = comp.last_stats is not None  # False: Horovod bypassed it
# One direct all-reduce of a fixed gradient, through a compressor of its own (the optimizer's
# sums a name it first sees after training exactly: a one-off value): the mean vote, times
# size, is an integer sum.
probe = hvdcomp.BinSGDM()
g = torch.randn(3000, generator=torch.Generator().manual_seed(hvd.rank()))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", hvdcomp.DirectCallWarning)
    mean = hvd.allreduce(g, name="direct", compression=probe)
values = sorted(set(np.round(mean.numpy() * hvd.size(), 4).tolist()))
hier = probe.engine.method.hierarchy  # BinSGDM's own node layout
legs = {k: v.bytes_sent for k, v in probe.last_legs.items()}

try:  # the strict mode: the same layout, refused when the node sizes differ
    hvd.allreduce(torch.ones(64), name="strict", compression=hvdcomp.BinSGDM(uneven="error"))
    error = None
except hvdcomp.HvdcompError as exc:
    error = f"{type(exc).__name__}: {exc}"
report(rank=hvd.rank(), steps=steps, identical_steps=identical, layout=hier.describe(),
       nodes=hier.nodes, local_size=hier.local_size, node_sizes=hier.node_sizes,
       flat_fallback=hier.flat_fallback, warnings=[str(w.message) for w in caught],
       legs=legs, sent=probe.last_stats.bytes_sent, elements=probe.last_stats.elements,
       mean_times_size=values[:8], trained_through_compressor=trained_through_compressor,
       error=error)
