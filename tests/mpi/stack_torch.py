"""Rank script: Horovod + PyTorch on real ranks.

Each rank allreduces rank-dependent tensors (sum and average, float32/float64/int64), then
trains a tiny model for a few steps with ``hvd.DistributedOptimizer`` on rank-dependent data
(after deliberately different per-rank initialisations, fixed by a broadcast from rank 0).
Rank 0 also trains a serial reference on all ranks' data concatenated, which plain SGD on
averaged gradients must reproduce. Rank 0 prints one ``RESULT {json}`` line per rank (see
report.py); the test does every comparison."""

import torch

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

import horovod.torch as hvd  # noqa: E402
from report import report_horovod  # noqa: E402

STEPS, LR, BATCH = 4, 0.2, 8


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def data(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(BATCH, 4, generator=g)
    y = torch.randn(BATCH, 1, generator=g)
    return x, y


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {"rank": rank, "size": size, "local_rank": hvd.local_rank(),
           "mpi_enabled": bool(hvd.mpi_enabled())}

    # --- allreduce of rank-dependent tensors -------------------------------------------
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    x64 = base * (rank + 1) + 10.0 * rank
    out["sum64"] = hvd.allreduce(x64, op=hvd.Sum, name="stack.sum64").tolist()
    out["avg64"] = hvd.allreduce(x64, op=hvd.Average, name="stack.avg64").tolist()
    x32 = (base.float() + 1.0) * (rank + 1)
    out["avg32"] = hvd.allreduce(x32, op=hvd.Average, name="stack.avg32").tolist()
    xi = torch.full((5,), rank + 1, dtype=torch.int64) * torch.arange(5)
    out["sumint"] = hvd.allreduce(xi, op=hvd.Sum, name="stack.sumint").tolist()
    # the input must not be modified by the out-of-place allreduce
    out["x64_after"] = x64.tolist()

    # --- DistributedOptimizer -------------------------------------------------------------
    model = make_model(seed=rank)           # different on every rank on purpose
    out["own_init"] = flat(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    init = flat(model)
    out["init"] = init
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    x, y = data(rank)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["final"] = flat(model)
    out["losses"] = losses

    if rank == 0:
        # serial reference: same initial weights, all ranks' batches at once
        ref = make_model(seed=0)
        xs, ys = zip(*(data(r) for r in range(size)))
        xa, ya = torch.cat(xs), torch.cat(ys)
        ropt = torch.optim.SGD(ref.parameters(), lr=LR)
        for _ in range(STEPS):
            ropt.zero_grad()
            torch.nn.functional.mse_loss(ref(xa), ya).backward()
            ropt.step()
        out["reference"] = flat(ref)

    report_horovod(hvd, out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
