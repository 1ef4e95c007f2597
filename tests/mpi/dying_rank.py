"""Rank script: Marsit training where one rank dies (SIGKILL, no clean-up) in the middle of the
run; the launcher must end the whole job with a non-zero exit instead of hanging."""
import os
import signal

import torch
import horovod.torch as hvd

import hvdcomp
from torch_common import batch, load_digits_split, make_model

hvd.init()
(xtr, ytr), _ = load_digits_split(0)
model = make_model(hidden=64)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(),
                               compression=hvdcomp.Marsit())
for step in range(100000):
    if step == 20 and hvd.rank() == hvd.size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    xb, yb = batch(xtr, ytr, step, hvd.rank())
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
