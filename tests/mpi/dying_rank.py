"""Rank script: Marsit training where one rank fails in the middle of the run; the launcher must
end the whole job with a non-zero exit instead of hanging. Arg: how the last rank fails:
- kill: SIGKILL at step 20 (no clean-up at all);
- raise: an uncaught exception at step 20 (the other ranks wait in a collective for it; hvdcomp's
  sys.excepthook aborts the MPI job, else the failing rank would wait in MPI_Finalize);
- stall: its last layer's bias is frozen from the start, so it would submit one gradient fewer
  and the other ranks would wait in Horovod's negotiation for a tensor it never sends; hvdcomp
  compares the optimizers' parameter lists at the first gradient and raises RankMismatchError
  on every rank, which aborts the job. (Without that check, Horovod's stall inspector
  (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, set by the test) would shut Horovod down.)"""
import os
import signal
import sys

import torch
import horovod.torch as hvd

import hvdcomp
from torch_common import batch, load_digits_split, make_model

mode = sys.argv[1] if len(sys.argv) > 1 else "kill"
hvd.init()
failing = hvd.rank() == hvd.size() - 1
(xtr, ytr), _ = load_digits_split(0)
model = make_model(hidden=64)
if mode == "stall" and failing:
    model[4].bias.requires_grad_(False)  # its gradient is the first one Horovod waits for
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(),
                               compression=hvdcomp.Marsit())
for step in range(100000):
    if step == 20 and failing and mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 20 and failing and mode == "raise":
        raise RuntimeError("rank failure injected by the test")
    xb, yb = batch(xtr, ytr, step, hvd.rank())
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
