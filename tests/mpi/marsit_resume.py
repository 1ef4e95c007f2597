"""Rank script: checkpoint at step N and resume gives bit-identical parameters at step N+M,
compared with the uninterrupted run. Covers both state forms: per-rank ``state_dict()`` and the
gathered ``state_dict(all_ranks=True)`` that rank 0 saves alone (broadcast here as if loaded from
rank 0's file). Arg: 'rank' or 'gathered'."""
import copy
import io
import sys

import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, digest, load_digits_split, make_model

form = sys.argv[1]
N, M = 6, 6
hvd.init()
torch.manual_seed(0)
(xtr, ytr), _ = load_digits_split(0)


def build(state=None):
    model = make_model(hidden=64)
    comp = hvdcomp.Marsit(seed=5)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=comp)
    if state is None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        comp.load_state_dict(state["comp"])
    return model, opt, comp


def train(model, opt, start, stop):
    for step in range(start, stop):
        xb, yb = batch(xtr, ytr, step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()


model, opt, comp = build()
train(model, opt, 0, N)
comp_state = comp.state_dict(all_ranks=(form == "gathered"))
if form == "gathered":
    comp_state = hvd.broadcast_object(comp_state if hvd.rank() == 0 else None, root_rank=0,
                                     name="comp_state")
buf = io.BytesIO()  # through torch.save/torch.load, as a user's checkpoint file would go
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "comp": comp_state}, buf)
train(model, opt, N, N + M)
uninterrupted = digest(model)
memory_norm = float(sum(float(abs(torch.as_tensor(v)).sum()) for v in comp.state_dict()["memory"].values()))

buf.seek(0)
state = torch.load(buf, weights_only=False)
model2, opt2, comp2 = build(copy.deepcopy(state))
train(model2, opt2, N, N + M)
resumed = digest(model2)

# A fresh compressor (state lost) must not reproduce the trajectory: the test can fail.
state["comp"] = hvdcomp.Marsit(seed=5).state_dict()
model3, opt3, _ = build(state)
train(model3, opt3, N, N + M)
report(rank=hvd.rank(), same=resumed == uninterrupted, fresh_differs=digest(model3) != uninterrupted,
       memory_norm=memory_norm, step=comp2.state_dict()["step"])
