"""hvdcomp compressors with TensorFlow 2.15 through Horovod's own wrappers, on real MPI ranks."""
import pytest

from mpirun import results, run


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [2, 4])
def test_marsit_eager_tf_function_and_keras(ranks):
    res = results(run(ranks, "tf_train.py", "marsit", 6 if ranks == 2 else 10, timeout=360))
    assert sorted(res) == list(range(ranks))
    for r in res.values():
        assert r["eager_identical"] and r["eager_bytes"] > 0
        assert r["tape_identical"] == r["tape_steps"] > 0  # with a retrace and an unused head
        assert r["keras_identical"] == r["keras_steps"] > 0
        # state keyed by variable names (stable across retraces), one per compressed variable
        assert r["tape_keys"] == ["dense/kernel:0", "kernel:0"], r["tape_keys"]
        assert r["keras_flushes"] >= r["keras_steps"]
    accs = {(r["tape_acc"], r["keras_acc"]) for r in res.values()}
    assert len(accs) == 1  # the same model everywhere
    tape_acc, keras_acc = accs.pop()
    assert tape_acc > 0.3 and keras_acc > 0.3, (tape_acc, keras_acc)  # it learns (10 classes)
