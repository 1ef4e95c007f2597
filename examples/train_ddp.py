"""Train a small classifier on scikit-learn's bundled digits with PyTorch DDP and an hvdcomp
communication hook. Launch with torchrun (no MPI, no Horovod), e.g.

    torchrun --nproc-per-node=4 examples/train_ddp.py --compression marsit
    torchrun --nproc-per-node=4 examples/train_ddp.py --compression none       # DDP's allreduce
    torchrun --nproc-per-node=4 examples/train_ddp.py --compression powersgd-hook  # PyTorch's

The only hvdcomp-specific lines register the hook:

    state = hvdcomp.ddp.State(hvdcomp.Marsit())
    model.register_comm_hook(state, hvdcomp.ddp.hook)

Prints per epoch the loss and test accuracy, and at the end the accuracy and whether every rank
holds bit-identical weights.
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import hvdcomp
import hvdcomp.ddp
import recipes  # examples/recipes.py: the learning rates
from digits import load_digits

METHODS = {name.lower(): cls for name, cls in hvdcomp.registry.METHODS.items()}


def register(model, name):
    """Register ``name``'s hook on ``model``: an hvdcomp method, DDP's fp16 hook, PyTorch's
    PowerSGD hook (rank 1), or none (DDP's own allreduce)."""
    if name in METHODS:
        model.register_comm_hook(hvdcomp.ddp.State(METHODS[name]()), hvdcomp.ddp.hook)
    elif name == "fp16-hook":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "powersgd-hook":
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif name != "none":
        raise SystemExit(f"unknown --compression {name!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compression", default="marsit",
                        help="none, fp16-hook, powersgd-hook or an hvdcomp method: "
                        + ", ".join(METHODS))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    pixels, labels = load_digits()
    x = torch.tensor(pixels / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(x))
    (xs, ys), (xt, yt) = (x[perm[:cut]], y[perm[:cut]]), (x[perm[cut:]], y[perm[cut:]])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)
    register(model, args.compression)
    lr, momentum = recipes.lr_momentum(
        args.compression if args.compression in METHODS else "none", "digits")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr or lr, momentum=momentum)
    mine = torch.arange(rank, len(xs), size)
    for epoch in range(args.epochs):
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for i in range(0, len(order) - 31, 32):
            batch = order[i:i + 32]
            opt.zero_grad()
            F.cross_entropy(model(xs[batch]), ys[batch]).backward()
            opt.step()
        with torch.no_grad():
            out = net(xt)
            loss, acc = F.cross_entropy(out, yt).item(), (out.argmax(1) == yt).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}: test loss {loss:.4f}, accuracy {acc:.4f}", flush=True)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters()))
    digests = [None] * size
    dist.all_gather_object(digests, digest.hexdigest())
    if rank == 0:
        print(f"{args.compression}: accuracy {acc:.4f} on {size} ranks; "
              f"ranks bit-identical: {len(set(digests)) == 1}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
