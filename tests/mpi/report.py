"""Rank scripts report to the test with ``RESULT {json}`` lines, written by rank 0 alone to the
file named by HVDCOMP_TEST_RESULTS (set by tests/mpirun.py), or to stdout when run by hand.
Not through the launcher's stdout: mpirun's forwarding can splice long lines from several ranks
into each other, and horovodrun's --tag-output can insert its tag in the middle of a line."""
import json
import os
import sys


def write_results(items):
    """Write one ``RESULT`` line per item (call on one rank only)."""
    text = "".join("RESULT " + json.dumps(item) + "\n" for item in items)
    path = os.environ.get("HVDCOMP_TEST_RESULTS")
    if path:
        with open(path, "a") as fh:
            fh.write(text)
    else:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), text.encode())


def cases(args, width):
    """A rank script's arguments ``args`` as the cases of its launch: tuples of ``width``."""
    assert args and len(args) % width == 0, f"cases of {width} arguments each, got {args}"
    return [tuple(args[i:i + width]) for i in range(0, len(args), width)]


def report(**fields):
    """Collective (every rank calls it once, at the end): rank 0 gathers all ranks' fields
    through mpi4py and writes them."""
    from mpi4py import MPI
    gathered = MPI.COMM_WORLD.gather(fields, root=0)
    # No rank leaves before rank 0 has everything: a rank that exits shuts Horovod down on
    # every rank, which may finalise MPI under rank 0 (when Horovod, not mpi4py, owns MPI).
    MPI.COMM_WORLD.Barrier()
    if gathered is not None:
        write_results(gathered)


def report_horovod(hvd, fields):
    """The same through Horovod's own allgather_object, for scripts that must not touch mpi4py."""
    gathered = hvd.allgather_object(fields)
    if hvd.rank() == 0:
        write_results(gathered)
