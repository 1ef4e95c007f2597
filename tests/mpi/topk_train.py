"""Rank script: train the digits MLP with the stock hvd.DistributedOptimizer and hvdcomp.TopK,
checking after every step that all ranks hold bit-identical parameters.
Args: compression ('none', 'topk' = hvdcomp.TopK(), 'topk-allgather', 'topk-uni'), epochs, lr."""
import sys

import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, identical_across_ranks, load_digits_split, make_model

compression_name, epochs, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
hvd.init()
torch.manual_seed(0)
(xtr, ytr), (xte, yte) = load_digits_split(0)
shard = torch.arange(hvd.rank(), len(xtr), hvd.size())
xtr, ytr = xtr[shard], ytr[shard]
model = make_model()
compression = {"none": lambda: hvd.Compression.none,
               "topk-bare": lambda: hvdcomp.TopK,  # the class itself: its default instance
               "topk": lambda: hvdcomp.TopK(ratio=0.01),
               "topk-allgather": lambda: hvdcomp.TopK(path="allgather"),
               "topk-uni": lambda: hvdcomp.TopK(bidirectional=False)}[compression_name]()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                               named_parameters=model.named_parameters(), compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
steps = epochs * (len(xtr) // 32)
identical = 0
for step in range(steps):
    xb, yb = batch(xtr, ytr, step, hvd.rank())
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    identical += identical_across_ranks(model)
with torch.no_grad():
    acc = (model(xte).argmax(1) == yte).float().mean().item()
    loss = torch.nn.functional.cross_entropy(model(xte), yte).item()
stats = getattr(compression, "total_stats", None)
if compression is hvdcomp.TopK:
    stats = hvdcomp.TopK.default().total_stats
report(rank=hvd.rank(), steps=steps, identical_steps=identical, acc=acc, loss=loss,
       stats=stats.as_dict() if stats is not None else None,
       memory_keys=sorted(compression.state_dict()["memory"]) if stats is not None else None)
