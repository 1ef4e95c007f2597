"""Shared pieces of the torch rank scripts: the demo's data and model, a deterministic batch
schedule, and a cross-rank bit-identity check of parameters."""
import hashlib
import os
import sys

import torch
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.append(os.path.join(HERE, ".."))  # tests/: variants.py
from train_torch import load_digits_split, make_model  # noqa: E402,F401
import variants  # noqa: E402

torch.set_num_threads(1)


def digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def identical_across_ranks(model):
    """True when every rank holds bit-identical parameters (checked through mpi4py)."""
    return len(set(MPI.COMM_WORLD.allgather(digest(model)))) == 1


def rank_shard(x, y):
    """This rank's slice of a training set: every hvd.size()-th sample from hvd.rank()."""
    import horovod.torch as hvd
    shard = torch.arange(hvd.rank(), len(x), hvd.size())
    return x[shard], y[shard]


def batch(x, y, step, rank, size=32):
    """The batch of ``step`` on ``rank``: fixed by (step, rank), so a resumed run sees the same."""
    g = torch.Generator().manual_seed(10007 * step + rank)
    idx = torch.randint(0, len(x), (size,), generator=g)
    return x[idx], y[idx]


def batch_loss(model, x, y, step, rank):
    """The cross-entropy of ``model`` on the batch of ``step`` on ``rank`` (``batch``)."""
    xb, yb = batch(x, y, step, rank)
    return torch.nn.functional.cross_entropy(model(xb), yb)


def flat(model):
    """Every parameter of ``model``, by name, in one flat tensor."""
    return torch.cat([p.detach().reshape(-1) for _, p in sorted(model.named_parameters())])


def compression_for(name):
    """The compression a test names: Horovod's own ('none', 'fp16'), or an hvdcomp preset of
    hvdcomp/registry.py or a test-local variant of one (tests/variants.py; e.g. 'topk-bare': the
    class itself)."""
    import horovod.torch as hvd
    if name in ("none", "fp16"):
        return getattr(hvd.Compression, name)
    return variants.make(name)


compressor_object = variants.compressor_object


def build(compression, lr, momentum, hidden=256, state=None):
    """Model + stock hvd.DistributedOptimizer(SGD) with ``compression``; parameters broadcast
    from rank 0, or restored from ``state`` ({'model', 'opt', 'comp'}) on every rank."""
    import horovod.torch as hvd
    torch.manual_seed(0)
    model = make_model(hidden)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    if state is None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        compressor_object(compression).load_state_dict(state["comp"])
    return model, opt


def train(model, opt, x, y, start, stop, check=True):
    """Steps ``start``..``stop`` on the deterministic batches; returns how many ended with
    bit-identical parameters on every rank (when ``check``)."""
    import horovod.torch as hvd
    identical = 0
    for step in range(start, stop):
        xb, yb = batch(x, y, step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        if check:
            identical += identical_across_ranks(model)
    return identical


def evaluate(model, x, y):
    """(accuracy, loss) on ``x``, ``y``."""
    with torch.no_grad():
        logits = model(x)
        return ((logits.argmax(1) == y).float().mean().item(),
                torch.nn.functional.cross_entropy(logits, y).item())


def grad_scaler_step(opt, scaler, loss):
    """One step of Horovod's documented AMP recipe: scaled backward, synchronize, unscale,
    the scaler's step without a second synchronize, the scaler's update."""
    scaler.scale(loss).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
