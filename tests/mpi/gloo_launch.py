"""Rank script for a Gloo-only launch (``horovodrun --gloo``): no MPI ranks exist, so each
process's MPI is a singleton of size 1 while Horovod runs ``size`` ranks. Every hvdcomp method
must refuse with LaunchError naming both worlds, on every rank, instead of hanging or reducing
alone. Reports through Horovod's own allgather (mpi4py sees one rank per process)."""
import torch
import horovod.torch as hvd

import hvdcomp
from hvdcomp import registry
from report import report_horovod

hvd.init()
out = {"rank": hvd.rank(), "size": hvd.size()}
for cls in registry.METHODS.values():
    try:
        hvd.allreduce(torch.randn(3000), name=f"g.{cls.__name__}", compression=cls())
        out[cls.__name__] = None
    except hvdcomp.LaunchError as exc:
        out[cls.__name__] = str(exc)
out["plain"] = float(hvd.allreduce(torch.ones(1), name="plain", op=hvd.Sum))  # Horovod still works
report_horovod(hvd, out)
