"""Rank script (2 ranks): the all-gathers of hvdcomp's checks per compressed step, for every
method, through the stock hvd.DistributedOptimizer (decision='compress', on_nonfinite='skip').
Each ``CommContext.allgather_array`` call (it waits) is counted by the function that made it
(``agree``: the batch agreement; ``gather_checked``: the statuses and the method's scalars), and
each ``iallgather_array`` call (it does not: the method's scalars alone) as ``check_batch``.
Reported per method: ``<m>.counts`` over STEPS steps, ``<m>.identical`` (bit-identical
parameters on every rank after them), then one step with a NaN in rank 1's gradient:
``<m>.nan_counts`` and ``<m>.nan_unchanged`` (every parameter as before that step, on every
rank: the step was skipped everywhere). Then ``iallgather_array`` with a ring all-reduce run
between its start and its completion (``iallgather``, ``iallgather_then``, beside
``allgather_array``'s rows and the ring's sum)."""
import collections
import sys

import numpy as np

import torch
import horovod.torch as hvd

from hvdcomp import registry
from hvdcomp.comm import get_context, ring_allreduce
from hvdcomp.comm.context import CommContext
from report import report
from torch_common import identical_across_ranks
import expect  # noqa: E402  (tests/expect.py)

STEPS = 4
hvd.init()
rank = hvd.rank()
calls = collections.Counter()
COUNTED = ("agree", "gather_checked", "check_batch")


def counted(gather):
    def call(self, *args, **kwargs):
        calls[sys._getframe(1).f_code.co_name] += 1
        return gather(self, *args, **kwargs)
    return call


CommContext.allgather_array = counted(CommContext.allgather_array)
CommContext.iallgather_array = counted(CommContext.iallgather_array)
out = {}
for m, cls in registry.METHODS.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    comp = cls(seed=1, decision="compress", on_nonfinite="skip", **expect.EXPECT[m].test_kwargs)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=[(f"{m}.{n}", p)
                                                     for n, p in model.named_parameters()],
                                   compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    for step in range(STEPS + 1):
        if step == 1:  # the first step sets up (layouts, ...): counted from the second on
            calls.clear()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    out[f"{m}.counts"] = {k: calls[k] for k in COUNTED}
    out[f"{m}.identical"] = identical_across_ranks(model)
    before = [p.detach().clone() for p in model.parameters()]
    calls.clear()
    opt.zero_grad()
    model(x).square().mean().backward()
    if rank == 1:
        model[0].weight.grad[0, 0] = float("nan")
    opt.step()
    out[f"{m}.nan_counts"] = {k: calls[k] for k in COUNTED}
    out[f"{m}.nan_unchanged"] = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
# A gather started without waiting, a ring all-reduce on the same communicator in between, then
# its completion: every rank's rows, as allgather_array gives them.
ctx = get_context()
pending = ctx.iallgather_array(np.arange(3) + 10 * rank)
shaped = pending.then(lambda rows: rows.reshape(ctx.size, 3, 1))
ring = ring_allreduce(ctx, np.full(1000, rank + 1.0, dtype=np.float32))
out["iallgather"] = pending.wait().tolist()
out["iallgather_then"] = float(shaped[1, 2, 0])
out["allgather"] = ctx.allgather_array(np.arange(3) + 10 * rank).tolist()
out["ring"] = float(ring[0])
report(rank=rank, **out)
