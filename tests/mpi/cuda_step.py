"""Rank script: every method on CUDA tensors, on real MPI ranks, beside the same gradients as host
arrays.

The GPU machines have no Horovod, so this drives what a Horovod step drives: the compressor's
batch entry point ``reduce_batch_now(keys, tensors)`` (``hvdcomp.facade``), with torch tensors
on ``cuda:<local rank>`` (the backend's Torch kernels, messages staged through host memory for
MPI) and, in the same job, with NumPy arrays of the same values (the host path the CPU tests
cover). Per method, rank 0 reports every rank's: the devices of the results, a digest of the
CUDA results (ranks must agree bit for bit), the largest difference from the host path relative
to the host result's largest magnitude, the share of elements that differ by more than 1e-4 of
it, whether a resume from ``state_dict()`` on CUDA replays the same bits, the kinds of array the
state is kept in, and what ``on_nonfinite='raise'`` gives for a NaN on the last rank.

    mpirun -np 2 python tests/mpi/cuda_step.py [Method ...]
"""
import hashlib
import sys

import numpy as np
import torch
from mpi4py import MPI

import hvdcomp
from report import report

SHAPES = {"a.weight": (300, 50), "b.weight": (4096,), "c.bias": (7,)}
STEPS, RESUME_AT = 6, 3
METHODS = ("Marsit", "EFSignSGD", "TopK", "BinSGDM", "SketchFusion")

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
# Without CUDA (a dry run of the script) the "cuda" side runs on CPU tensors, i.e. host arrays.
DEVICE = (torch.device("cuda", RANK % torch.cuda.device_count()) if torch.cuda.is_available()
          else torch.device("cpu"))


def gradients(step):
    """This rank's gradients of ``step``: {name: float32 array}, heavy-tailed, zeros included."""
    rng = np.random.default_rng(1000 * step + RANK)
    out = {}
    for name, shape in SHAPES.items():
        g = (rng.standard_normal(shape) * rng.exponential(1.0, shape)).astype(np.float32)
        g.reshape(-1)[:2] = (0.0, -0.0)
        out[name] = g
    return out


def steps(comp, kind, first, last, poison=None):
    """Results of steps ``first``..``last - 1``: a list (per step) of lists (per sorted name)."""
    outs = []
    for step in range(first, last):
        grads = gradients(step)
        if poison is not None and step == poison and RANK == SIZE - 1:
            grads["b.weight"][5] = np.nan
        keys = sorted(grads)
        values = [torch.from_numpy(grads[k]).to(DEVICE) if kind == "cuda" else grads[k]
                  for k in keys]
        outs.append(comp.reduce_batch_now(keys, values))
    return outs


def host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def digest(outs):
    h = hashlib.sha256()
    for step in outs:
        for x in step:
            h.update(host(x).tobytes())
    return h.hexdigest()[:16]


def compare(gpu, cpu):
    """(largest |gpu - cpu| / largest |cpu|, share of elements off by more than 1e-4 of it)."""
    worst, off, total = 0.0, 0, 0
    for gs, cs in zip(gpu, cpu):
        for g, c in zip(gs, cs):
            g, c = host(g).astype(np.float64), host(c).astype(np.float64)
            scale = max(np.abs(c).max(), 1e-30)
            diff = np.abs(g - c) / scale
            worst = max(worst, float(diff.max()))
            off += int((diff > 1e-4).sum())
            total += diff.size
    return worst, off / max(total, 1)


def state_kinds(store):
    """The kinds and devices the state is kept in, e.g. ['torch@cuda:0']."""
    kinds = set()
    for key in store.keys():
        value = store.get(key)
        for v in value if isinstance(value, tuple) else (value,):
            kinds.add(f"{type(v).__module__.split('.')[0]}@{getattr(v, 'device', 'host')}")
    return sorted(kinds)


def nan_step(cls):
    """A NaN in 'b.weight' on the last rank at step 1, ``on_nonfinite='raise'``: the message on
    this rank, the step counter before/after, and whether the next clean step works."""
    comp = cls(on_nonfinite="raise")
    steps(comp, "cuda", 0, 1)
    before = comp.engine.step
    try:
        steps(comp, "cuda", 1, 2, poison=1)
        message = None
    except hvdcomp.HvdcompError as exc:
        message = f"{type(exc).__name__}: {exc}"
    after = comp.engine.step
    clean = steps(comp, "cuda", 2, 3)
    return {"message": message, "step_before": before, "step_after": after,
            "clean_digest": digest(clean)}


def main():
    names = sys.argv[1:] or METHODS
    out = {"rank": RANK, "device": str(DEVICE), "methods": {}}
    for name in names:
        cls = getattr(hvdcomp, name)
        gpu_comp, cpu_comp = cls(), cls()
        gpu = steps(gpu_comp, "cuda", 0, STEPS)
        cpu = steps(cpu_comp, "host", 0, STEPS)
        first = cls()
        steps(first, "cuda", 0, RESUME_AT)
        resumed = cls()
        resumed.load_state_dict(first.state_dict())
        replay = steps(resumed, "cuda", RESUME_AT, STEPS)
        worst, off = compare(gpu, cpu)
        out["methods"][name] = {
            "devices": sorted({str(x.device) if isinstance(x, torch.Tensor) else "numpy"
                               for s in gpu for x in s}),
            "digest": digest(gpu), "max_rel_diff": worst, "share_off": off,
            "resume_identical": digest(replay) == digest(gpu[RESUME_AT:]),
            "state_kinds": state_kinds(gpu_comp.store),
            "nan": nan_step(cls),
        }
    report(**out)


if __name__ == "__main__":
    main()
