"""hvdcomp's own traffic: contexts, byte counting, the ring all-reduce and the transport's own
sum, on a transport (``hvdcomp.comm.transport``: mpi4py's communicator, or torch.distributed's
Gloo group for the DDP hook).

This layer moves and combines contiguous NumPy buffers; it knows nothing about which
compression method produced them. Methods plug in through a per-hop ``combine`` function.
"""
from hvdcomp.comm.context import (CommContext, existing_context, get_context, world_rank,
                                  world_size)
from hvdcomp.comm.ring import (float16_allreduce, mean_allreduce, mpi_allreduce,
                               ring_allreduce, sum_combine)
from hvdcomp.comm.stats import CommStats

__all__ = ["CommContext", "existing_context", "get_context", "world_rank", "world_size",
           "float16_allreduce", "mean_allreduce", "mpi_allreduce", "ring_allreduce",
           "sum_combine", "CommStats"]
