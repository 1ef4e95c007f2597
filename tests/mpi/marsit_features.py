"""Rank script: per-parameter state follows its parameter through the awkward cases of the stock
torch optimizer, with every rank bit-identical after every step:
- zero_grad(set_to_none=True) (new grad tensors every step),
- an auxiliary head that some ranks use on some steps (its parameters get no gradient there;
  Horovod fills zeros in synchronize(), in an order that differs between ranks),
- backward_passes_per_step=2,
- two optimizers with their own Marsit instances, and the error when two optimizers share the
  bare class while their parameter names collide.
"""
import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, identical_across_ranks, load_digits_split, make_model


class WithAux(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = make_model(hidden=64)
        self.aux = torch.nn.Linear(64, 64)  # 4096 weights: large enough to be compressed

    def forward(self, x, use_aux):
        return self.body(self.aux(x) if use_aux else x)


hvd.init()
torch.manual_seed(0)
(xtr, ytr), _ = load_digits_split(0)
rank = hvd.rank()
checks = {}

# 1 + 2: unused parameters on some ranks, set_to_none, memory keyed per parameter.
model = WithAux()
comp = hvdcomp.Marsit()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(), compression=comp)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
ok = 0
for step in range(12):
    xb, yb = batch(xtr, ytr, step, rank)
    opt.zero_grad()
    use_aux = (step + rank) % 3 == 0
    torch.nn.functional.cross_entropy(model(xb, use_aux), yb).backward()
    opt.step()
    ok += identical_across_ranks(model)
keys = sorted(comp.state_dict()["state"])
checks["unused_params_identical_steps"] = ok
checks["memory_keys"] = keys
checks["memory_shapes_match"] = all(
    comp.state_dict()["state"][k].size == dict(model.named_parameters())[k].numel() for k in keys)

# 3: backward_passes_per_step=2 (gradients accumulated locally, one compressed exchange).
model2 = make_model(hidden=64)
comp2 = hvdcomp.Marsit()
opt2 = hvd.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.02),
                                named_parameters=model2.named_parameters(), compression=comp2,
                                backward_passes_per_step=2)
hvd.broadcast_parameters(model2.state_dict(), root_rank=0)
ok = 0
for step in range(6):
    opt2.zero_grad()
    for micro in range(2):
        xb, yb = batch(xtr, ytr, 2 * step + micro, rank)
        torch.nn.functional.cross_entropy(model2(xb), yb).backward()
    opt2.step()
    ok += identical_across_ranks(model2)
checks["bpps2_identical_steps"] = ok
checks["bpps2_flushes"] = comp2.total_stats.steps

# 4: two optimizers (e.g. a GAN's), each with its own instance; states stay apart.
ma, mb = make_model(hidden=64), make_model(hidden=64)
ca, cb = hvdcomp.Marsit(), hvdcomp.Marsit()
oa = hvd.DistributedOptimizer(torch.optim.SGD(ma.parameters(), lr=0.02),
                              named_parameters=[("a." + n, p) for n, p in ma.named_parameters()],
                              compression=ca)
ob = hvd.DistributedOptimizer(torch.optim.SGD(mb.parameters(), lr=0.02),
                              named_parameters=[("b." + n, p) for n, p in mb.named_parameters()],
                              compression=cb)
hvd.broadcast_parameters(ma.state_dict(), root_rank=0)
hvd.broadcast_parameters(mb.state_dict(), root_rank=0)
ok = 0
for step in range(5):
    xb, yb = batch(xtr, ytr, step, rank)
    oa.zero_grad()
    ob.zero_grad()
    (torch.nn.functional.cross_entropy(ma(xb), yb) + torch.nn.functional.cross_entropy(mb(xb), yb)).backward()
    oa.step()
    ob.step()
    ok += identical_across_ranks(ma) and identical_across_ranks(mb)
checks["two_opt_identical_steps"] = ok
checks["two_opt_keys_apart"] = (all(k.startswith("a.") for k in ca.state_dict()["state"]) and
                                all(k.startswith("b.") for k in cb.state_dict()["state"]))

# 5: the bare class shared by two optimizers whose names collide: a clear error, not a mix-up.
mc, md = make_model(hidden=64), make_model(hidden=64)
oc = hvd.DistributedOptimizer(torch.optim.SGD(mc.parameters(), lr=0.02),
                              named_parameters=mc.named_parameters(), compression=hvdcomp.Marsit)
od = hvd.DistributedOptimizer(torch.optim.SGD(md.parameters(), lr=0.02),
                              named_parameters=md.named_parameters(), compression=hvdcomp.Marsit)
xb, yb = batch(xtr, ytr, 0, rank)
oc.zero_grad()
torch.nn.functional.cross_entropy(mc(xb), yb).backward()
oc.step()
od.zero_grad()
try:
    torch.nn.functional.cross_entropy(md(xb), yb).backward()
    od.step()
    checks["collision_error"] = None
except hvdcomp.HvdcompError as exc:
    checks["collision_error"] = str(exc)
report(rank=rank, **checks)
