"""Rank script for a world of one rank (run with HOROVOD_ELASTIC=1, so that Horovod's torch
DistributedOptimizer calls the compressor at size 1). Per method: a direct hvd.allreduce sends
no bytes and gives the method's one-rank result (TopK ratio 1 and SketchFusion ratio 1: the
gradient itself; Marsit: mean|g| * sign(g); BinSGDM: sign(g): expect.EXPECT's one_rank, built
with its one_rank_kwargs), and a few optimizer steps go through the compressor. Every method of
hvdcomp/registry.py."""
import torch
import horovod.torch as hvd

from hvdcomp import registry
from report import report
from torch_common import batch, load_digits_split, make_model
import expect  # noqa: E402  (tests/expect.py)

hvd.init()
(xtr, ytr), _ = load_digits_split(0)
g = torch.randn(3000, generator=torch.Generator().manual_seed(0))
RESULTS = {"identity": g, "sign": g.sign(), "scaled-sign": g.abs().mean() * g.sign()}
expected = {m: RESULTS[e.one_rank] for m, e in expect.EXPECT.items()}
METHODS = {m: (lambda cls=cls, m=m: cls(**expect.EXPECT[m].one_rank_kwargs))
           for m, cls in registry.METHODS.items()}
out = {"size": hvd.size()}
for m, make in METHODS.items():
    comp = make()
    r = hvd.allreduce(g, name=f"{m}.g", compression=comp)
    out[f"{m}.direct"] = [comp.last_stats.bytes_sent, r.shape == g.shape,
                          float((r - expected[m]).abs().max())]
    torch.manual_seed(0)
    model = make_model(hidden=32)
    comp = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=comp)
    for step in range(3):
        xb, yb = batch(xtr, ytr, step, 0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    out[f"{m}.trained"] = [comp.last_stats is not None and comp.last_stats.step,
                           all(bool(torch.isfinite(p).all()) for p in model.parameters())]
report(rank=hvd.rank(), **out)
