"""Rank script: training throughput through PyTorch DDP at one link rate: every hvdcomp hook
against DDP's own all-reduce, its fp16 hook and PyTorch's PowerSGD hook, and the compute ceiling,
from one torchrun job (no MPI, no Horovod).

    benchmarks/ddp_regimes.sh                          # the emulated cluster, its links
    torchrun --nproc-per-node=4 benchmarks/ddp_regimes.py --model resnet18

The models, batches and optimizers are ``regimes.py``'s (``models.py``). Configurations
(``--methods``): ``ceiling`` (the user's optimizer alone, no DDP: the step with the exchange
removed), ``ddp`` (DDP's all-reduce), ``ddp-fp16`` (``fp16_compress_hook``), ``powersgd-1`` /
``powersgd-4`` (PyTorch's PowerSGD hook at rank 1 / 4, ``start_powerSGD_iter=10`` as in its
docs' example; each bucket awaited, ``waited``), and every hvdcomp method (``hvdcomp.ddp.State(Method())``, defaults). All are
built at once (same seed), warmed up (``--warmup``, default 12: past PowerSGD's start; hvdcomp's
further while its decision probes, up to ``--max-warmup``) and timed in interleaved rounds
(``rounds.measure``), a step being the slowest rank's seconds after a barrier. ``r`` is
torch.distributed's fp32 all-reduce of the model's size over the compute ceiling's step. Rank 0
prints and appends one JSON object per configuration to ``--out`` (``rounds.write``).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import hvdcomp
import hvdcomp.ddp
from hvdcomp.comm.transport import TorchTransport

import rounds  # this folder
import models
from models import build, make_batch, user_optimizer

HOOKS = {name.lower(): cls for name, cls in hvdcomp.registry.METHODS.items()}
PEERS = ("ddp", "ddp-fp16", "powersgd-1", "powersgd-4")


def waited(hook):
    """``hook`` with each bucket's Future awaited before the next bucket: PyTorch's PowerSGD hook
    issues collectives from its Futures' callbacks, and on Gloo those of concurrent buckets reach
    the ranks in different orders (a size mismatch aborts the job; pytorch/pytorch#58467)."""
    def run(state, bucket):
        done = torch.futures.Future()
        done.set_result(hook(state, bucket).wait())
        return done
    return run


class HookDecision:
    """What ``rounds`` reads of a configuration's compressor: the hook's decision, once its
    runtime exists."""

    def __init__(self, state):
        self.state = state

    @property
    def decision(self):
        rt = self.state.runtime
        return None if rt is None else rt.decision


class Config(models.Trained):
    """One configuration: the model (in DDP with its hook, but for the ceiling) and the user's
    optimizer."""

    def __init__(self, args, method):
        model = build(args)
        comp = None
        if method != "ceiling":
            model = torch.nn.parallel.DistributedDataParallel(model)
            if method == "ddp-fp16":
                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif method.startswith("powersgd-"):
                state = powerSGD_hook.PowerSGDState(
                    None, matrix_approximation_rank=int(method.split("-")[1]),
                    start_powerSGD_iter=10)
                model.register_comm_hook(state, waited(powerSGD_hook.powerSGD_hook))
            elif method != "ddp":
                state = hvdcomp.ddp.State(HOOKS[method]())
                model.register_comm_hook(state, hvdcomp.ddp.hook)
                comp = HookDecision(state)
        super().__init__(method, comp, model, user_optimizer(args, model))


def main():
    ap = argparse.ArgumentParser()
    models.add_args(ap)
    rounds.add_args(ap)
    ap.set_defaults(methods=",".join(("ceiling",) + PEERS + tuple(HOOKS)), warmup=12)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    comm = TorchTransport()
    batch = make_batch(args, torch.Generator().manual_seed(comm.rank))
    model = build(args)
    params = sum(p.numel() for p in model.parameters())
    job = {"model": args.model, "ranks": comm.size, "launcher": "torchrun",
           "hosts": len(set(comm.node_of_ranks())), "params": params,
           "tensors": sum(1 for _ in model.parameters()), "batch": args.batch}
    del model
    ones = torch.ones(params)
    job["allreduce_seconds"] = rounds.allreduce_seconds(comm, lambda: dist.all_reduce(ones))
    del ones
    rounds.run(args, comm, batch, lambda m: Config(args, m), job)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HVDCOMP_ABORT_ON_EXCEPTION", "0")
    main()
