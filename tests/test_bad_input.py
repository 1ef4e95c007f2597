"""Bad and unusual input for every hvdcomp method, on real MPI ranks with real Horovod: each case
raises a clear error (which tensor, which rank, what was expected) on every rank, or is handled
correctly (fp16/bf16, empty and 0-d tensors, sparse gradients). Constructor validation needs no
MPI. Rank script: tests/mpi/bad_input.py."""
import pytest

import hvdcomp
import expect
from hvdcomp import registry
from mpirun import results, run

METHODS = list(registry.METHODS)


@pytest.fixture(scope="module")
def bad_input():
    res = results(run(2, "bad_input.py", timeout=240))
    assert sorted(res) == [0, 1]
    return res


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_low_precision_fp16_bf16(bad_input, m):
    """dtype and shape kept, finite, equal to the float32 path on the same values cast back."""
    for r in bad_input.values():
        for dt in ("float16", "bfloat16"):
            kept_dtype, kept_shape, finite, equal_fp32, nonzero = r[f"{m}.lowp_{dt}"]
            assert kept_dtype and kept_shape and finite and equal_fp32, (m, dt)
            assert nonzero >= 400, (m, dt, nonzero)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_empty_and_0d_tensors(bad_input, m):
    for r in bad_input.values():
        assert r[f"{m}.empty"] == [[0], 0, "torch.float32"]
        shape, value, dtype = r[f"{m}.scalar"]
        assert shape == [] and dtype == "torch.float32"
        if expect.EXPECT[m].small_exact:  # summed exactly, uncompressed: mean of 0 and 1
            assert value == 0.5
        else:  # every tensor is voted on (BinSGDM): the mean of a random and a +1 vote
            assert value in (0.0, 1.0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_unsupported_dtypes_and_sparse_tensor_raise(bad_input, m):
    for rank, r in bad_input.items():
        for dt in ("int32", "int64", "bool", "complex64", "sparse"):
            msg = r[f"{m}.unsupported_{dt}"]
            assert msg and msg.startswith(f"{m}: tensor '{m}.bad_{dt}' on rank 0 has dtype"), msg
            assert dt in msg and "floating-point" in msg
            assert msg.endswith(f"(raised on rank {rank})"), msg  # each rank names itself
        assert "sparse float32" in r[f"{m}.unsupported_sparse"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_shape_numel_dtype_differing_between_ranks_raise(bad_input, m):
    for r in bad_input.values():
        assert f"'{m}.shaped' differs between ranks (rank 0: 3000 elements, shape [100, 30], " \
               "float32, rank 1: 3000 elements, shape [30, 100], float32)" in r[f"{m}.shape_error"]
        assert "rank 0: 2000 elements, shape [2000], float32, rank 1: 2100 elements" \
            in r[f"{m}.numel_error"]
        assert f"'{m}.typed' differs" in r[f"{m}.dtype_error"]
        assert "rank 1: 3000 elements, shape [3000], float64" in r[f"{m}.dtype_error"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_a_different_number_of_gradients_raises(bad_input, m):
    """The last rank froze a layer: its DistributedOptimizer would submit one gradient fewer;
    the ranks' parameter lists are compared at the optimizer's first gradient."""
    for r in bad_input.values():
        msg = r[f"{m}.count_error"]
        assert msg and ("ranks disagree about the parameters their optimizer reduces (per "
                        "rank: rank 0: 6, rank 1: 5)") in msg, msg
        assert f"'{m}.0.weight' only on rank(s) [0]" in msg


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_nan_and_inf_raise_naming_tensor_and_rank(bad_input, m):
    for r in bad_input.values():
        for kind in ("nan", "inf"):
            msg = r[f"{m}.{kind}_error"]
            assert msg and f"NaN or Inf in gradient '{m}.{kind}' on rank 1" in msg, msg
            assert "on_nonfinite='skip'" in msg
        # default on_nonfinite='propagate': NaN on every rank, state as before, one skipped step
        assert r[f"{m}.propagated"] == [True, 1, True]
    if m == "Marsit":  # precondition='adam' in its warm-up: the same error, state unchanged
        for r in bad_input.values():
            assert "NaN or Inf in gradient 'adam.nan' on rank 1" in r["adam.nan_error"]
            assert r["adam.t_after"] == 1  # the failed step did not count


@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", METHODS)
def test_sparse_gradients(bad_input, m):
    """nn.Embedding(sparse=True): without sparse_as_dense Horovod reduces the sparse gradient
    itself (uncompressed; the result equals compression=none), the dense one is compressed;
    with sparse_as_dense=True both go through the compressor. Ranks bit-identical."""
    want = expect.EXPECT[m]
    vector = [] if want.exact_vectors else ["w"]  # the 2000-element vector's state
    for r in bad_input.values():
        assert r[f"{m}.sparse_same"] and r[f"{m}.sparse_identical"]
        assert r[f"{m}.sparse_dense_compressed"] == [
            want.state_keys([f"{m}.sp.{t}" for t in vector]), 2000]
        assert r[f"{m}.dense_compressed"] == [
            want.state_keys([f"{m}.spd.{t}" for t in ["emb", *vector]]), 14000]
        assert r[f"{m}.dense_identical"] and r[f"{m}.dense_finite_moved"] == [True, True]


# -- construction: invalid settings raise ValueError naming the argument (no MPI) ---------------
# per method: expect.EXPECT[method].invalid
INVALID = {m: expect.EXPECT[m].invalid for m in METHODS}


@pytest.mark.parametrize("m, arg, value", [(m, a, v) for m, cases in INVALID.items()
                                           for a, v in cases])
def test_invalid_settings_rejected_at_construction(m, arg, value):
    with pytest.raises(ValueError, match=arg):
        registry.METHODS[m](**{arg: value})


def test_topk_ratio_and_k_together_and_sketch_smaller_than_k():
    with pytest.raises(ValueError, match="ratio= or k="):
        hvdcomp.TopK(ratio=0.1, k=10)
    with pytest.raises(ValueError, match="raise cols"):  # known once the step's size is known
        hvdcomp.SketchFusion(0.5, cols=100).shape_for(1000)
