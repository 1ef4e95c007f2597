"""Rank script: hvdcomp.TopK(ratio=0.01) through the stock torch optimizer; a checkpoint of the
compressor's per-rank memory (state_dict / load_state_dict, through torch.save) resumes bit for
bit, and losing it changes the trajectory."""
import copy
import io

import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, digest, identical_across_ranks, load_digits_split, make_model

N, M = 6, 6
hvd.init()
torch.manual_seed(0)
(xtr, ytr), _ = load_digits_split(0)


def build(state=None):
    model = make_model(hidden=64)
    comp = hvdcomp.TopK(ratio=0.01, seed=3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=comp)
    if state is None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        comp.load_state_dict(state["comp"])
    return model, opt, comp


def train(model, opt, start, stop):
    same = 0
    for step in range(start, stop):
        xb, yb = batch(xtr, ytr, step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        same += identical_across_ranks(model)
    return same


model, opt, comp = build()
identical = train(model, opt, 0, N)
buf = io.BytesIO()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "comp": comp.state_dict()}, buf)
identical += train(model, opt, N, N + M)
uninterrupted = digest(model)
memory = comp.state_dict()["memory"]

buf.seek(0)
state = torch.load(buf, weights_only=False)
model2, opt2, comp2 = build(copy.deepcopy(state))
train(model2, opt2, N, N + M)
state["comp"] = hvdcomp.TopK(ratio=0.01, seed=3).state_dict()
model3, opt3, _ = build(state)
train(model3, opt3, N, N + M)
report(rank=hvd.rank(), identical_steps=identical, same=digest(model2) == uninterrupted,
       fresh_differs=digest(model3) != uninterrupted, memory_keys=sorted(memory),
       memory_norm=float(sum(abs(v).sum() for v in memory.values())),
       step=comp2.state_dict()["step"])
