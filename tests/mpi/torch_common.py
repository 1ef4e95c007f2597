"""Shared pieces of the torch rank scripts: the demo's data and model, a deterministic batch
schedule, and a cross-rank bit-identity check of parameters."""
import hashlib
import os
import sys

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from train_torch import load_digits_split, make_model  # noqa: E402,F401

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


def batch(x, y, step, rank, size=32):
    """The batch of ``step`` on ``rank``: fixed by (step, rank), so a resumed run sees the same."""
    g = torch.Generator().manual_seed(10007 * step + rank)
    idx = torch.randint(0, len(x), (size,), generator=g)
    return x[idx], y[idx]
