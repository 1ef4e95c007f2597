"""A Keras user's Adam in ``model.fit`` through Horovod's Keras ``DistributedOptimizer`` with
settings that change the gradients between Horovod's reduction and Adam's update (issue 82):
mixed precision (Keras's LossScaleOptimizer has Horovod reduce the scaled gradients) and Keras's
own ``global_clipnorm``, on 2 real MPI ranks, each against Horovod's own ``none`` in the same
launch. Rank script: tests/mpi/keras_edits.py."""
import pytest

from mpirun import results, run, shared

METHODS = ["marsit", "topk", "sketchfusion-bare", "efsignsgd", "binsgdm"]


@shared
def keras_edits_launch(case):
    return results(run(2, "keras_edits.py", case, "none", *METHODS, timeout=400))


@pytest.mark.timeout(450)
@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("case", ["mixed", "clipnorm"])
def test_keras_adam_trains_as_uncompressed_under_mixed_precision_and_its_own_clipping(case, name):
    """Every epoch's loss finite and the held-out loss and accuracy near uncompressed training.
    Before: under mixed_float16 hvdcomp mixed the scaled gradients with Adam's unscaled momentum
    (every step from the first compressed one non-finite: accuracy 0.11 with a NaN loss, exit 0);
    under global_clipnorm Adam's first moment was the unclipped momentum (NaN losses)."""
    res = keras_edits_launch(case)
    assert sorted(res) == [0, 1]
    none, got = res[0]["none"], res[0][name]
    assert none["nonfinite_epochs"] == 0 and got["nonfinite_epochs"] == 0, (case, got)
    assert got["accuracy"] > none["accuracy"] - 0.15, (case, name, got, none)
    assert got["held_out_loss"] < 2 * none["held_out_loss"], (case, name, got, none)
    assert all(res[r][name]["identical"] for r in (0, 1))
