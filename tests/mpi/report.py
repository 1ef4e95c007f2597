"""Rank scripts report to the test with ``RESULT {json}`` lines. ``report`` is collective (every
rank calls it once, at the end): rank 0 gathers all ranks' fields and alone writes the lines, so
lines from different ranks never interleave in the launcher's output."""
import json
import os
import sys

from mpi4py import MPI


def report(**fields):
    gathered = MPI.COMM_WORLD.gather(fields, root=0)
    if gathered is not None:
        for item in gathered:
            os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(item) + "\n").encode())
