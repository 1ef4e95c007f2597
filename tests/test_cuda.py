"""CUDA tensors: the backend's Torch kernels on the GPU against the host (NumPy) path, and every
method on CUDA gradients on real MPI ranks (tests/mpi/cuda_step.py). Skipped where torch sees no
CUDA device (the development and CI machines); run on the GPU machine."""
import numpy as np
import pytest
import torch

from hvdcomp.backend import bernoulli_mask, merge_bits, pack_signs, unpack_signs
from hvdcomp.methods.sketchfusion import sketch as sk
from hvdcomp.backend import topk as sel
from hvdcomp.methods.binsgdm.stochastic import stochastic_signs, uniforms
from mpirun import results, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

LENGTHS = [1, 7, 8, 9, 1000, 100_003]


def _cuda(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _host(t):
    assert t.is_cuda, "a CUDA input gave a result off the device"
    return t.cpu().numpy()


def _vector(n, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.exponential(1.0, n)).astype(np.float32)
    x[:min(n, 2)] = (0.0, -0.0)[:min(n, 2)]
    return x


@pytest.mark.parametrize("n", LENGTHS)
def test_sign_bits_on_cuda_match_the_host(n):
    x = _vector(n)
    packed = pack_signs(x)
    assert np.array_equal(_host(pack_signs(_cuda(x))), packed)
    assert np.array_equal(_host(unpack_signs(_cuda(packed), n)), unpack_signs(packed, n))
    other, mask = pack_signs(_vector(n, 1)), bernoulli_mask((1, 2), packed.size, 0.3)
    assert np.array_equal(_host(merge_bits(_cuda(packed), _cuda(other), _cuda(mask))),
                          merge_bits(packed, other, mask))


def test_keyed_randomness_on_cuda():
    """Marsit's masks: the host's bytes. BinSGDM's uniforms: made on the device by the documented
    counter hash (checked against a pure-Python reference), reproducible, key-dependent, and
    unbiased votes."""
    like = torch.zeros(1, device="cuda")
    assert np.array_equal(_host(bernoulli_mask((7, 3), 1001, 1 / 3, like=like)),
                          bernoulli_mask((7, 3), 1001, 1 / 3))
    key, n = (4, 5, 1, 0), 1_000_000
    u = _host(uniforms(key, n, like=like))
    w0, w1 = np.random.SeedSequence(list(key)).generate_state(2, np.uint32).tolist()

    def fmix(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)
    for i in (0, 1, 2, 999_999):
        assert u[i] == np.float32((fmix(fmix(i ^ w0) ^ w1) >> 8) / 2 ** 24)
    assert np.array_equal(u, _host(uniforms(key, n, like=like)))
    assert not np.array_equal(u, _host(uniforms((4, 6, 1, 0), n, like=like)))
    p = _cuda(np.full(n, 0.3, np.float32))
    share = float((stochastic_signs(p, key) > 0).float().mean())
    assert abs(share - 0.3) < 5 * (0.3 * 0.7 / n) ** 0.5


def test_votes_and_mean_vote_on_cuda_match_the_host():
    from hvdcomp.methods.binsgdm.math import mean_vote
    from hvdcomp.methods.efsignsgd.method import majority_step, vote_total
    rows = np.stack([pack_signs(_vector(10_001, s)) for s in range(3)])
    like = torch.zeros(1, device="cuda")
    total = vote_total(rows, 10_001)
    assert np.array_equal(_host(vote_total(rows, 10_001, like=like)), total)
    assert np.array_equal(_host(majority_step(_cuda(total), 0.37)), majority_step(total, 0.37))
    votes = total.astype(np.int8)
    assert np.array_equal(_host(mean_vote(votes, 3, like=like)), mean_vote(votes, 3))


@pytest.mark.parametrize("method", ["exact", "approx"])
def test_topk_selection_on_cuda_matches_the_host(method):
    x = _vector(100_003, 3)
    idx, val = sel.select_topk(x, 1000, method, seed=5)
    cidx, cval = sel.select_topk(_cuda(x), 1000, method, seed=5)
    order, corder = np.argsort(idx), np.argsort(_host(cidx))
    assert np.array_equal(_host(cidx)[corder], idx[order])
    assert np.array_equal(_host(cval)[corder], val[order])


def test_sketch_on_cuda_matches_the_host():
    """The device's table equals the host's up to float rounding (its own summation order); its
    estimates and heavy hitters of one table are the host's exactly."""
    x = _vector(50_000, 4)
    h = sk.hashes(x.size, 5, 2000, seed=9)
    table = sk.sketch(x, h)
    device_table = _host(sk.sketch(_cuda(x), h))
    assert np.abs(device_table - table).max() <= 1e-5 * np.abs(table).max()
    assert np.array_equal(_host(sk.unsketch(table, h, device="cuda")), sk.unsketch(table, h))
    idx, est = sk.heavy_hitters(table, h, 300)
    didx, dest = sk.heavy_hitters(table, h, 300, device="cuda")
    assert np.array_equal(_host(didx), idx) and np.array_equal(_host(dest), est)


@pytest.mark.timeout(400)
def test_every_method_on_cuda_ranks():
    """2 ranks, CUDA gradients through the batch entry point: results on the device, ranks
    bit-identical, within 1e-4 (relative to the largest value) of the host path on all but a 1/1000
    share of elements (the l1 and vote sums run in another order on the GPU, so a few signs near
    zero can flip; BinSGDM draws the host's random stream on the device), resume from
    ``state_dict()`` bit-identical, a NaN raises on every rank naming the tensor and rank and
    leaves the step counter as it was."""
    res = results(run(2, "cuda_step.py", timeout=380))
    assert sorted(res) == [0, 1]
    for name, per in res[0]["methods"].items():
        other = res[1]["methods"][name]
        assert per["devices"] == ["cuda:0"] or per["devices"] == [res[0]["device"]], name
        assert per["digest"] == other["digest"], name
        assert per["resume_identical"] and other["resume_identical"], name
        assert per["share_off"] <= 1e-3, (name, per["max_rel_diff"], per["share_off"])
        assert all(k.startswith("torch@cuda") for k in per["state_kinds"]), per["state_kinds"]
        for r in (per, other):
            nan = r["nan"]
            assert "NonFiniteGradientError" in nan["message"] and "'b.weight'" in nan["message"]
            assert "rank 1" in nan["message"] and nan["step_before"] == nan["step_after"]
        assert per["nan"]["clean_digest"] == other["nan"]["clean_digest"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_every_method_through_horovods_optimizer_on_cuda(optimizer):
    """The user's path on a GPU: a CUDA model trained through the stock
    ``hvd.DistributedOptimizer`` with each method (and Horovod's none and fp16) on 2 ranks, under
    plain SGD and under the user's AdamW (its momentum sent; BinSGDM's step applied through
    AdamW's moments): the parameters stay on the device, every rank ends with the same weights
    bit for bit, and the loss falls. Needs Horovod built with CUDA (benchmarks/gpu_check.sh)."""
    hvd = pytest.importorskip("horovod.torch")
    if not hvd.cuda_built():
        pytest.skip("Horovod was built without CUDA")
    res = results(run(2, "cuda_horovod.py", *(["adamw"] if optimizer == "adamw" else []),
                      timeout=380))
    assert sorted(res) == [0, 1]
    for name, per in res[0]["methods"].items():
        other = res[1]["methods"][name]
        assert all(d.startswith("cuda") for d in per["devices"] + other["devices"]), name
        assert per["digest"] == other["digest"], name
        assert per["loss_last"] < 0.9 * per["loss_first"], (name, per["loss_first"],
                                                             per["loss_last"])
