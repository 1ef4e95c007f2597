"""Rank script: tensor naming with horovod.torch (hvdcomp.facade.frontends.naming).

Case ``paths``: the stock DistributedOptimizer, its default path, ``num_groups=2`` and
``groups=[[...], [...]]``, 3 steps each with TopK on every tensor: the compressor's state keys
are the parameter names, the identities carry the parameter, the optimizer and its process set;
direct calls with ``name=`` (hvd.allreduce, hvd.grouped_allreduce) keep separate state: a second
call on zeros returns exactly zeros (TopK and Marsit, fresh memory); unnamed calls raise
UnnamedTensorError (reported per rank). Case ``uncaught``: an unnamed hvd.allreduce, uncaught:
the job ends non-zero with the error printed by every rank."""
import sys

import torch

import horovod.torch as hvd
import hvdcomp
from hvdcomp.facade.frontends import torch as adapter
from report import report
from torch_common import digest, identical_across_ranks

torch.set_num_threads(1)
hvd.init()
rank, size = hvd.rank(), hvd.size()
CASE = sys.argv[1]

if CASE == "uncaught":
    hvd.allreduce(torch.ones(3000), compression=hvdcomp.Marsit())  # no name=: raises
    raise SystemExit("not reached")

seen = []  # every Identity the adapter returned
_lookup = adapter.tensor_identity


def recording(tensor, method):
    identity = _lookup(tensor, method)
    seen.append(identity)
    return identity


adapter.tensor_identity = recording


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 12),
                               torch.nn.ReLU(), torch.nn.Linear(12, 4))


def train(mode):
    net = model()
    groups = {"default": {}, "num_groups": {"num_groups": 2},
              "groups": {"groups": [[net[0].weight, net[4].bias], [net[2].weight, net[0].bias]]}}
    comp = hvdcomp.TopK(min_compress_numel=1, ratio=0.25)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(), compression=comp,
                                   **groups[mode])
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    params = dict(net.named_parameters())
    seen.clear()
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 20, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    right = all(params[i.name] is i.owner and i.optimizer is opt
                and i.process_set is hvd.global_process_set for i in seen)
    return {"keys": sorted(comp.state_dict()["state"]), "names": sorted(params),
            "identities": len(seen), "owners_right": right,
            "identical": identical_across_ranks(net), "digest": digest(net)}


def error_of(fn):
    try:
        fn()
    except hvdcomp.UnnamedTensorError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


out = {mode: train(mode) for mode in ("default", "num_groups", "groups")}
g = torch.randn(4096, generator=torch.Generator().manual_seed(rank))
for cls in (hvdcomp.TopK, hvdcomp.Marsit):
    comp = cls()
    first = hvd.allreduce(g, name="direct.a", compression=comp)
    second = hvd.allreduce(torch.zeros(4096), name="direct.zeros", compression=comp)
    out[cls.__name__] = {"first_nonzero": int(torch.count_nonzero(first)),
                         "zeros_max": float(second.abs().max()),
                         "keys": sorted(comp.state_dict()["state"])}
comp = hvdcomp.TopK()
seen.clear()
hvd.grouped_allreduce([g, 2 * g], name="grp", compression=comp)
out["grouped_keys"] = sorted(comp.state_dict()["state"])
out["direct_process_sets"] = [i.process_set is hvd.global_process_set for i in seen]
out["unnamed"] = error_of(lambda: hvd.allreduce(g, compression=hvdcomp.Marsit()))
out["unnamed_grouped"] = error_of(lambda: hvd.grouped_allreduce([g], compression=hvdcomp.TopK()))
report(rank=rank, **out)
