"""Rank script: the digits MLP through the stock hvd.DistributedOptimizer, first uncompressed with
SGD-momentum (the baseline), then with ``compression=hvdcomp.BinSGDM`` and plain SGD (no
momentum, no warm-up), checking after every step that all ranks hold bit-identical parameters.
Then a checkpoint/resume check of BinSGDM's (m, v) state. Args: epochs lr_sgdm lr_binsgdm.
The node layout comes from HVDCOMP_RANKS_PER_NODE (set by the test)."""
import copy
import io
import sys

import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, digest, identical_across_ranks, load_digits_split, make_model

epochs, lr_sgdm, lr_bin = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
hvd.init()
(xtr, ytr), (xte, yte) = load_digits_split(0)
shard = torch.arange(hvd.rank(), len(xtr), hvd.size())
xtr, ytr = xtr[shard], ytr[shard]
steps = epochs * (len(xtr) // 32)


def build(compression, lr, momentum, hidden=256):
    torch.manual_seed(0)
    model = make_model(hidden)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, opt


def train(model, opt, start, stop, check=False):
    identical = 0
    for step in range(start, stop):
        xb, yb = batch(xtr, ytr, step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        if check:
            identical += identical_across_ranks(model)
    return identical


def evaluate(model):
    with torch.no_grad():
        logits = model(xte)
        return ((logits.argmax(1) == yte).float().mean().item(),
                torch.nn.functional.cross_entropy(logits, yte).item())


model, opt = build(hvd.Compression.none, lr_sgdm, 0.9)
train(model, opt, 0, steps)
base_acc, base_loss = evaluate(model)

comp = hvdcomp.BinSGDM()  # the public class, configured with its defaults
model, opt = build(comp, lr_bin, 0.0)
identical = train(model, opt, 0, steps, check=True)
acc, loss = evaluate(model)
legs = {k: v.bytes_sent for k, v in comp.last_legs.items()}
layout, train_stats = comp.hierarchy().describe(), comp.total_stats.as_dict()
elements = comp.last_stats.elements

# Checkpoint at step N, resume, and compare with the uninterrupted run at N + M.
N, M = 5, 5
comp = hvdcomp.BinSGDM(seed=3)
model, opt = build(comp, lr_bin, 0.0, hidden=32)
train(model, opt, 0, N)
buf = io.BytesIO()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "comp": comp.state_dict()}, buf)
train(model, opt, N, N + M)
uninterrupted = digest(model)
state_keys = sorted(comp.state_dict()["memory"])
state_pair = all(isinstance(v, tuple) and len(v) == 2
                 for v in comp.state_dict()["memory"].values())


def resumed(comp_state):
    buf.seek(0)
    state = torch.load(buf, weights_only=False)
    comp2 = hvdcomp.BinSGDM(seed=3)
    model2, opt2 = build(comp2, lr_bin, 0.0, hidden=32)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["opt"])
    comp2.load_state_dict(copy.deepcopy(state["comp"]) if comp_state is None else comp_state)
    train(model2, opt2, N, N + M)
    return digest(model2)


report(rank=hvd.rank(), steps=steps, identical_steps=identical, acc=acc, loss=loss,
       base_acc=base_acc, base_loss=base_loss, stats=train_stats, legs=legs, layout=layout,
       elements=elements,
       resume_same=resumed(None) == uninterrupted,
       fresh_differs=resumed(hvdcomp.BinSGDM(seed=3).state_dict()) != uninterrupted,
       state_keys=state_keys, state_pair=state_pair)
