"""Checkpoint formats: today's compressors write format 2 and still load format 1 (the format
of the previous release), continuing bit for bit as the old release did (BinSGDM: as the reference
math does from the loaded moments, its votes now drawn from another stream; tests/mpi/
load_format1.py)."""
import pytest

from mpirun import results, run

CASES = ["marsit-rms", "topk", "binsgdm", "marsit-adam"]


@pytest.fixture(scope="module")
def loaded():
    return results(run(1, "load_format1.py", timeout=120))[0]


@pytest.mark.parametrize("case", CASES)
def test_format1_checkpoint_loads_and_continues_bit_for_bit(loaded, case):
    assert loaded[case] is True  # the next step's outputs equal the old release's
    assert loaded[case + ".keys"] is True  # the same per-tensor state keys
    assert loaded[case + ".format"] == 2  # and it is saved again in today's format
