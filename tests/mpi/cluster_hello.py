"""A tiny job for the emulated cluster (tests/test_cluster.py): every rank reports its host name,
its address on the cluster link, and the result of an mpi4py allreduce; ``--fail`` makes rank 3
die (exit status 3, no MPI_Finalize) after the allreduce (the harness must still clean up)."""
import json
import os
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
big = comm.allreduce(sum(range(rank * 1000, rank * 1000 + 100000)), op=MPI.SUM)
iface = os.environ.get("HVDC_CLUSTER_IFACE", "cl0")
try:
    with open(f"/sys/class/net/{iface}/address") as f:
        mac = f.read().strip()
except OSError:
    mac = None
print("RESULT " + json.dumps({"rank": rank, "size": size, "host": socket.gethostname(),
                              "sum": total, "big": big, "mac": mac}), flush=True)
if "--fail" in sys.argv and rank == size - 1:
    # Dies as a crashed rank does: without MPI_Finalize (sys.exit would run mpi4py's finalize,
    # which waits for the other ranks, stuck in the barrier, until the job's timeout).
    os._exit(3)
if "--hang" in sys.argv:
    if rank == size - 1:  # hangs; the others leave quietly (no busy-waiting barrier)
        import time
        time.sleep(3600)
else:
    comm.Barrier()
