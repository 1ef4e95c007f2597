"""hvdcomp's own cost per tensor: a model of 1,000 parameters of 16 elements (all below
``min_compress_numel``, so nothing is compressed and the result is Horovod's own sum) through the
stock ``hvd.DistributedOptimizer``, with Horovod's ``none`` or an hvdcomp method; prints the
median step time of the timed steps on rank 0.

    mpirun -np 2 python benchmarks/many_tensors.py none
    mpirun -np 2 python benchmarks/many_tensors.py Marsit --warm 30 --steps 40
"""
import argparse
import statistics
import time

import torch
import horovod.torch as hvd

import hvdcomp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("compression", help="'none' or an hvdcomp method's name, e.g. Marsit")
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--numel", type=int, default=16)
    ap.add_argument("--warm", type=int, default=30, help="untimed steps (the decision's probe)")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    params = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(args.numel))
                                    for _ in range(args.tensors))
    compression = (hvd.Compression.none if args.compression == "none"
                   else getattr(hvdcomp, args.compression))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.01),
                                   named_parameters=[(f"p{i}", p) for i, p in enumerate(params)],
                                   compression=compression)
    x = torch.randn(args.numel)
    times = []
    for step in range(args.warm + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        sum((p * x).sum() for p in params).backward()
        opt.step()
        if step >= args.warm:
            times.append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        print(f"{args.compression}: {args.tensors} tensors of {args.numel}, median step "
              f"{1e3 * statistics.median(times):.1f} ms ({1e3 * min(times):.1f}-"
              f"{1e3 * max(times):.1f}) over {args.steps} steps on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
