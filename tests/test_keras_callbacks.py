"""Horovod's own Keras callbacks (``horovod.tensorflow.keras.callbacks``) on the default stack
(TensorFlow >= 2.16 with tf-keras, TF_USE_LEGACY_KERAS=1), in a script shaped as Horovod's
examples/tensorflow2/tensorflow2_keras_mnist.py, on 2 real MPI ranks, with Horovod's own
compression and with an hvdcomp one. Rank script: tests/mpi/keras_callbacks.py."""
import pytest

from mpirun import results, run


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", ["none", "marsit"])
def test_horovods_keras_callbacks_run_with_every_compression(name):
    """The warm-up callback raises the learning rate from lr/size to lr over 2 epochs, the
    schedule callback halves it at epoch 3, the metric callback averages the logs over the
    ranks (the same on both), the broadcast callback makes the weights agree. Before (Horovod's
    callbacks took Keras 3's backend): AttributeError, 'keras.backend' has no 'get_value'."""
    res = results(run(2, "keras_callbacks.py", name, timeout=180))
    assert sorted(res) == [0, 1]
    epochs = [res[r]["epochs"] for r in (0, 1)]
    assert epochs[0] == epochs[1]  # averaged metrics, the same learning rate
    lrs = [e["lr"] for e in epochs[0]]
    scaled = 0.001 * 2
    assert lrs[0] < scaled and lrs[1] == pytest.approx(scaled, rel=1e-5), lrs  # the warm-up
    # the schedule: lr * 0.5 ** (epoch - 2) from epoch 2
    assert lrs[2] == pytest.approx(scaled, rel=1e-5) and lrs[3] == pytest.approx(scaled / 2,
                                                                                 rel=1e-5), lrs
    assert epochs[0][-1]["accuracy"] > 0.5, epochs[0]
    assert all(res[r]["identical"] for r in (0, 1))
