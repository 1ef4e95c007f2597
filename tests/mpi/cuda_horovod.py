"""Rank script: the user's path on a GPU, a model on CUDA trained through the stock
``hvd.DistributedOptimizer`` with each method as ``compression=`` (and Horovod's none and fp16).

Needs Horovod built with CUDA (benchmarks/gpu_check.sh builds it on the GPU machine with
scripts/build_horovod.sh; Horovod stages CUDA tensors through host memory for MPI, so several
ranks may share one GPU). Per compression, each rank trains the same MLP (weights broadcast from
rank 0) on its own batches of a synthetic classification task for ``STEPS`` steps with plain SGD
(lr 0.05, BinSGDM's too: its step has the gradient's scale under SGD), timing each step with ``torch.cuda.synchronize()``; rank 0 reports every
rank's: the parameters' devices, a digest of the final weights (ranks must agree bit for bit),
the first and last losses (averaged over ranks), the median step time after ``WARMUP`` steps,
and, for hvdcomp, the bytes sent per step (``last_stats``). With ``adamw`` as argument every
compression trains under the user's ``torch.optim.AdamW`` (lr 1e-3) instead: the Adam paths
(``hvdcomp.preconditioning.FollowAdam``, ``ThroughAdam`` for BinSGDM) on CUDA.

    mpirun -np 2 python tests/mpi/cuda_horovod.py [adamw]
"""
import hashlib
import statistics
import sys
import time

import torch
import horovod.torch as hvd

from hvdcomp import registry
from report import report_horovod

STEPS, WARMUP, BATCH, WIDTH = 40, 5, 256, 1024
METHODS = {"none": None, "fp16": "fp16", **registry.METHODS}  # every method of the registry
ADAMW = sys.argv[1:] == ["adamw"]

hvd.init()
RANK = hvd.rank()
# Without CUDA (a dry run of the script) everything runs on the CPU.
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count()) if CUDA else \
    torch.device("cpu")
sync = torch.cuda.synchronize if CUDA else (lambda: None)
if CUDA:
    torch.cuda.set_device(DEVICE)


def task():
    """This rank's batches (inputs, labels) of a linearly separable 10-class task."""
    gen = torch.Generator().manual_seed(7)
    centers = torch.randn(10, 64, generator=gen) * 2
    gen.manual_seed(100 + RANK)
    labels = torch.randint(0, 10, (STEPS, BATCH), generator=gen)
    inputs = centers[labels] + torch.randn(STEPS, BATCH, 64, generator=gen)
    return inputs.to(DEVICE), labels.to(DEVICE)


def compression_of(name):
    if METHODS[name] is None:
        return hvd.Compression.none
    if METHODS[name] == "fp16":
        return hvd.Compression.fp16
    return METHODS[name]()


def train(name, inputs, labels):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, 10)).to(DEVICE)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = compression_of(name)
    inner = (torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01) if ADAMW
             else torch.optim.SGD(model.parameters(), lr=0.05))
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                   compression=compression)
    losses, times = [], []
    for step in range(STEPS):
        sync()
        start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs[step]), labels[step])
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    stats = getattr(compression, "last_stats", None)
    return {"devices": sorted({str(p.device) for p in model.parameters()}),
            "digest": h.hexdigest()[:16],
            "loss_first": hvd.allreduce(torch.tensor(losses[0]), name=f"{name}.l0").item(),
            "loss_last": hvd.allreduce(torch.tensor(losses[-1]), name=f"{name}.l1").item(),
            "step_ms": 1000 * statistics.median(times[WARMUP:]),
            "bytes_per_step": getattr(stats, "bytes_sent", None)}


inputs, labels = task()
results = {name: train(name, inputs, labels) for name in METHODS}
report_horovod(hvd, {"rank": RANK, "gpu": torch.cuda.get_device_name(DEVICE) if CUDA else None,
                     "horovod_cuda": bool(hvd.cuda_built()), "methods": results})
