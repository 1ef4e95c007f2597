"""What a steady training step allocates on the host, through the stock hvd.DistributedOptimizer.

    mpirun -np 2 python tests/mpi/steady_allocation.py NAME [NAME ...] [--steps 3] [--warm 3]

For each compression NAME (tests/variants.py, or Horovod's 'none'), a fresh 2-layer MLP of ~1M
float32 parameters trains ``--warm`` steps, then ``--steps`` steady steps (forward, backward,
``step()``) under tracemalloc. Reported per rank (``report``): ``peak``, the most host memory
NumPy held during a steady step above what was live before it, in units of the gradient's bytes
(hvdcomp's arrays are NumPy's; Torch's own CPU tensors are not traced, nor Horovod's buffers);
``in_place``, whether every compressed gradient came back in the tensor ``compress()`` was given
(``p.grad`` keeps its storage, as with Horovod's own in-place allreduce); ``reused``, whether
every steady step handed back each gradient in the same storage as the step before (a method
that steps aside hands back a view of its message, reused once ``zero_grad`` released it);
the parameters' digest
(the ranks must agree); ``direct_out_of_place``, whether a direct ``hvd.allreduce`` with the
same compression left its input as it was.
"""
import argparse
import sys
import tracemalloc

import horovod.torch as hvd
import torch

from report import report
from torch_common import compression_for, digest

WARM = 3  # steps before the measured ones (--warm): the state and its spares exist after two


def train(name, steps, warm=WARM):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                   named_parameters=model.named_parameters(),
                                   compression=compression_for(name))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    big = [p for p in model.parameters() if p.numel() >= 1024]
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    peaks, in_place, handed = [], True, []
    for step in range(warm + steps):
        x = torch.randn(64, 512, generator=gen)
        steady = step >= warm
        if steady:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        opt.zero_grad()
        model(x).square().mean().backward()
        given = [p.grad.data_ptr() for p in big]  # compress() has seen these
        opt.step()
        if steady:
            peaks.append((tracemalloc.get_traced_memory()[1] - before) / grad_bytes)
            in_place &= given == [p.grad.data_ptr() for p in big]
            handed.append([p.grad.data_ptr() for p in big])
    return max(peaks), in_place, all(h == handed[0] for h in handed), digest(model)


def direct_call_is_out_of_place(name):
    """``hvd.allreduce(x, compression=...)`` returns a new tensor and leaves ``x`` as it was,
    also in steady steps (where an optimizer's gradient would be overwritten)."""
    compression = compression_for(name)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(hvd.rank()))
    before = x.clone()
    results = [hvd.allreduce(x, name="direct.x", compression=compression) for _ in range(WARM)]
    return torch.equal(x, before) and all(y.data_ptr() != x.data_ptr() for y in results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warm", type=int, default=WARM, help="e.g. 12: past the dense warm-up of "
                    "precondition='adam' (10 steps by default)")
    args = ap.parse_args()
    # Traced from before Horovod's background thread exists, and never stopped: that thread
    # releases Torch tensors (creating a Python thread state) after a step returns, and CPython
    # 3.11's tracemalloc.stop() racing such an allocation segfaults (CPython gh-128679).
    tracemalloc.start()
    hvd.init()
    out = {}
    for name in args.names:
        peak, in_place, reused, dig = train(name, args.steps, args.warm)
        out[name] = {"peak": peak, "in_place": in_place, "reused": reused, "digest": dig,
                     "direct_out_of_place": name == "none" or direct_call_is_out_of_place(name)}
        if hvd.rank() == 0:
            print(f"{name}: steady-step host allocation {peak:.3f} x gradient bytes, "
                  f"results in place: {in_place}, storage reused: {reused}", flush=True)
    report(rank=hvd.rank(), methods=out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
