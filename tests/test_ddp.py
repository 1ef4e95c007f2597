"""hvdcomp.ddp on real ranks: every method as a DDP communication hook, launched by torchrun
(2 emulated hosts x 2 ranks, Gloo, no MPI rank), on the digits MLP (tests/ddp/ddp_train.py)."""
import statistics

import pytest

from hvdcomp import registry
from mpirun import shared
from test_training import EPOCHS, STAND_INS, TOLERANCE_ACC, TOLERANCE_LOSS
from torchrun import run

METHODS = [m.lower() for m in registry.METHODS]
# The Horovod tests' tolerance against the uncompressed run and their steps (tests/
# test_training.py: 20 epochs of 11 steps, TopK's and SketchFusion's longer runs there).
STEPS = {m.lower(): 11 * EPOCHS.get(STAND_INS.get(m), 20) for m in registry.METHODS}
SEEDS = {"marsit": (0, 1, 2)}  # seed-dependent: the median of these seeds
TRAIN = ["none@220"] + [f"{m}#{s}@{STEPS[m]}" for m in METHODS for s in SEEDS.get(m, (0,))]


@shared
def launch(*specs):
    """One torchrun job running every ``CASE=METHODS`` spec; rank 0's results."""
    return run("tests/ddp/ddp_train.py", *specs, timeout=400,
               env={"HVDCOMP_DECISION": "compress"})


def train_results():
    return {r["method"]: r for r in launch("train=" + ",".join(TRAIN))}


def checks_results(case):
    specs = ("resume=" + ",".join(f"{m}@20" for m in METHODS), "passthrough=marsit@20",
             "amp=marsit@20,topk@20",
             "nosync=marsit,topk", "mismatch=marsit")
    return [r for r in launch(*specs) if r["case"] == case]


@pytest.mark.timeout(500)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_through_the_hook_as_uncompressed(method):
    res = train_results()
    base = res["none"]
    runs = [r for name, r in res.items() if name.split("#")[0] == method]
    acc = statistics.median(r["accuracy"] for r in runs)
    loss = statistics.median(r["loss"] for r in runs)
    print(f"none acc {base['accuracy']:.4f} loss {base['loss']:.4f}; {method} acc {acc:.4f} "
          f"loss {loss:.4f} (median of {len(runs)})")
    assert acc >= base["accuracy"] - TOLERANCE_ACC
    assert loss <= base["loss"] + TOLERANCE_LOSS
    for r in runs:
        assert r["identical"], "ranks hold different parameters"
        assert r["compressed"] > 0
        assert r["iter"] == STEPS[method]


@pytest.mark.timeout(500)
@pytest.mark.parametrize("method", METHODS)
def test_a_checkpoint_resumes_bit_for_bit(method):
    (r,) = [r for r in checks_results("resume") if r["method"] == method]
    assert r["resumed_identical"], "the resumed run left the uninterrupted one"
    assert r["identical"] and r["iter"] == 20
    assert r["unpickled_iter"] == 10  # pickled at half the steps


@pytest.mark.timeout(500)
def test_no_sync_accumulation_reduces_once_as_one_large_batch():
    res = checks_results("nosync")
    assert len(res) == 2
    for r in res:
        assert r["hook_iterations"] == 1
        assert r["distance"] < 1e-4, r  # float rounding of the accumulated gradient


@pytest.mark.timeout(500)
def test_a_passed_step_is_ddps_own_allreduce():
    (r,) = checks_results("passthrough")
    assert r["equal"] and r["compressed"] == 0


@pytest.mark.timeout(500)
def test_a_changing_grad_scaler_scale_trains_as_without_scaling():
    res = checks_results("amp")
    assert len(res) == 2 and all(r["equal"] for r in res)


@pytest.mark.timeout(500)
def test_settings_that_differ_raise_on_every_rank():
    (r,) = checks_results("mismatch")
    assert r["raised_on"] == ["SetupMismatchError"] * 4
