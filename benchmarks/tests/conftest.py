"""The benchmark scripts' own tests: pure functions of the scripts in benchmarks/, imported as
the scripts import each other (benchmarks/ on the path); no MPI. ``make test`` and ``make unit``
run them with the package's tests (tests/conftest.py marks their tier)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
