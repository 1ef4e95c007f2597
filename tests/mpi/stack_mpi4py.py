"""Rank script: mpi4py and Horovod in one job.

mpi4py.MPI is imported (and so MPI initialised, asking for MPI_THREAD_MULTIPLE) before
Horovod, then ``hvd.init()`` reuses that MPI. The script interleaves a Horovod allreduce, an
mpi4py Allreduce on a duplicate of COMM_WORLD, and another Horovod allreduce, and reports the
results, the thread level and both views of rank/size. Rank 0 prints one ``RESULT {json}``
line per rank (see report.py)."""

from mpi4py import MPI  # must come before horovod

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

import horovod.torch as hvd  # noqa: E402
from report import report_horovod  # noqa: E402


def main():
    out = {"mpi_initialized_before_hvd": bool(MPI.Is_initialized())}
    hvd.init()
    world = MPI.COMM_WORLD
    rank = hvd.rank()
    out.update({
        "rank": rank, "hvd_rank": rank, "hvd_size": hvd.size(),
        "mpi_rank": world.Get_rank(), "mpi_size": world.Get_size(),
        "query_thread": MPI.Query_thread(), "thread_multiple": MPI.THREAD_MULTIPLE,
        "hvd_mpi_threads_supported": bool(hvd.mpi_threads_supported()),
        "hvd_mpi_enabled": bool(hvd.mpi_enabled()),
    })
    comm = world.Dup()

    a = torch.arange(4, dtype=torch.float64) + 100.0 * rank
    out["hvd1"] = hvd.allreduce(a, op=hvd.Sum, name="stack.mpi4py.1").tolist()

    send = np.arange(4, dtype=np.float64) * (rank + 1)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, op=MPI.SUM)
    out["mpi"] = recv.tolist()
    out["mpi_max"] = comm.allreduce(rank * 7 + 1, op=MPI.MAX)

    b = torch.full((3,), float(rank + 1))
    out["hvd2"] = hvd.allreduce(b, op=hvd.Average, name="stack.mpi4py.2").tolist()

    comm.Barrier()
    comm.Free()
    report_horovod(hvd, out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
