"""SketchFusion (issue 6): the Count-Sketch backend, the LayerFusion planner, and the compressor on
real MPI ranks (each job under tests/mpirun.py's hard timeout)."""
import math

import numpy as np
import pytest
import torch

import hvdcomp
from hvdcomp import fusion
from hvdcomp.methods.sketchfusion import math as alg
from hvdcomp.methods.sketchfusion import sketch as cs
from mpirun import results, run


# -- Count-Sketch --------------------------------------------------------------------------------
def test_hashes_are_a_function_of_seed_and_shape_only():
    a = cs.CountSketchHashes(1000, 3, 50, seed=4)
    b = cs.CountSketchHashes(1000, 5, 50, seed=4)
    assert a.chunks == 20 and a.offsets.shape == (3, 20)
    assert np.array_equal(a.offsets, b.offsets[:3])
    assert np.array_equal(a.chunk_signs, b.chunk_signs[:3])
    idx = np.arange(1000)
    buckets, signs = a.buckets(idx), a.signs(idx)
    assert buckets.shape == (3, 1000) and buckets.min() >= 0 and buckets.max() < 50
    assert set(np.unique(signs)) == {-1, 1}
    for q in range(a.chunks):  # the positions of one chunk never share a bucket
        assert all(len(set(buckets[j, q * 50:(q + 1) * 50])) == 50 for j in range(3))
    assert not np.array_equal(a.offsets, cs.CountSketchHashes(1000, 3, 50, seed=5).offsets)
    assert cs.hashes(1000, 3, 50, 4) is cs.hashes(1000, 3, 50, 4)  # cached


def test_offset_hashes_collide_like_random_ones():
    """Two positions of different chunks share a bucket with probability 1/c, and the signs of
    colliding positions are independent (what the estimates' variance rests on)."""
    n, c, rows = 20_000, 100, 400
    h = cs.CountSketchHashes(n, rows, c, seed=11)
    pairs = np.random.default_rng(0).integers(0, n, size=(2, 2000))
    pairs = pairs[:, pairs[0] // c != pairs[1] // c]
    same = h.buckets(pairs[0]) == h.buckets(pairs[1])
    rate = same.mean()
    assert abs(rate - 1 / c) < 4 * np.sqrt(1 / c / same.size)
    agree = (h.signs(pairs[0]) == h.signs(pairs[1]))[same]
    assert abs(agree.mean() - 0.5) < 4 * np.sqrt(0.25 / agree.size)


@pytest.mark.parametrize("n,cols", [(0, 7), (1, 7), (1000, 7), (1000, 1000), (1001, 250), (37, 64)])
def test_sketch_and_unsketch_follow_the_hash_definition(n, cols):
    """The slice-wise sketch equals ``table[j, h_j(i)] += s_j(i) * x[i]`` element by element, and
    the blocked full unsketch equals the per-index one."""
    rng = np.random.default_rng(n + cols)
    x = rng.integers(-50, 50, n).astype(np.float32)
    h = cs.CountSketchHashes(n, 3, cols, seed=1)
    want = np.zeros((3, cols), np.float64)
    idx = np.arange(n)
    for j in range(3):
        np.add.at(want[j], h.buckets(idx)[j], h.signs(idx)[j] * x.astype(np.float64))
    table = cs.sketch(x, h)
    assert np.array_equal(table, want.astype(np.float32))
    old = cs.BLOCK, cs.TABLE_BLOCK
    cs.BLOCK, cs.TABLE_BLOCK = 13, 5  # small blocks: runs cut at block edges, same numbers
    try:
        assert np.array_equal(cs.sketch(x, h), table)
        assert np.array_equal(cs.unsketch(table, h), cs.unsketch(table, h, idx))
    finally:
        cs.BLOCK, cs.TABLE_BLOCK = old


def test_sketch_is_linear_exactly_for_integer_values():
    rng = np.random.default_rng(0)
    h = cs.hashes(30_000, 5, 700, seed=1)
    x, y = (rng.integers(-1000, 1000, 30_000).astype(np.float32) for _ in range(2))
    assert np.array_equal(cs.sketch(x + y, h), cs.merge(cs.sketch(x, h), cs.sketch(y, h)))
    assert np.array_equal(cs.sketch(3 * x, h), 3 * cs.sketch(x, h))
    assert cs.sketch(x, h).dtype == np.float32 and cs.sketch(x, h).shape == (5, 700)


def test_unsketch_is_exact_without_collisions_and_accepts_torch():
    torch = pytest.importorskip("torch")
    h = cs.hashes(10_000, 5, 4000, seed=2)
    x = np.zeros(10_000, np.float32)
    x[[7, 4242, 9999]] = [3.0, -8.5, 1.25]
    t = cs.sketch(torch.from_numpy(x), h)
    assert np.array_equal(cs.unsketch(t, h)[[7, 4242, 9999]], x[[7, 4242, 9999]])
    assert np.array_equal(cs.unsketch(t, h, [7, 4242]), x[[7, 4242]])
    idx, est = cs.heavy_hitters(t, h, 3)
    assert idx.tolist() == [7, 4242, 9999] and np.array_equal(est, x[idx])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_heavy_hitters_of_planted_vectors(seed):
    """k planted coordinates of magnitude 4..8 over N(0, 0.05) noise, n = 200k, c = 50 k, r = 9:
    all recovered, estimates within 1 (a small BLOCK forces a blocked unsketch). The rows must
    grow like log n for a guarantee over all n positions: with r = 5 a light position collides
    with heavy ones in 3 of 5 rows about n * 10 * (k/c)**3 = 16 times here, and a few of those
    outrank the smallest planted values."""
    rng = np.random.default_rng(seed)
    n, k = 200_000, 40
    x = (0.05 * rng.standard_normal(n)).astype(np.float32)
    planted = np.sort(rng.choice(n, k, replace=False))
    x[planted] = rng.choice([-1, 1], k) * rng.uniform(4, 8, k)
    h = cs.hashes(n, 9, 50 * k, seed=seed)
    old, cs.BLOCK = cs.BLOCK, 1 << 14
    try:
        idx, est = cs.heavy_hitters(cs.sketch(x, h), h, k)
    finally:
        cs.BLOCK = old
    assert np.array_equal(idx, planted)
    assert np.abs(est - x[planted]).max() < 1.0  # bucket noise: 0.05 * sqrt(n / c) = 0.5


def test_apply_conserves_mass_both_ways():
    a = np.arange(10, dtype=np.float32)
    idx, sums = np.array([2, 7]), np.array([8.0, 30.0], np.float32)
    applied, mem = alg.apply(a, idx, sums, 4, exact=True)
    assert applied[[2, 7]].tolist() == [2.0, 7.5] and np.count_nonzero(applied) == 2
    assert mem[[2, 7]].tolist() == [0, 0] and np.array_equal(np.delete(mem, idx), np.delete(a, idx))
    applied, mem = alg.apply(a, idx, sums, 4, exact=False)
    assert mem[[2, 7]].tolist() == [0.0, -0.5]


# -- SketchFusion settings -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"ratio": 0}, {"ratio": 1.5}, {"ratio": -0.1},
                                    {"ratio": float("nan")}, {"ratio": "0.1"}, {"ratio": True},
                                    {"rows": 0}, {"rows": 2.5}, {"cols": 0}, {"width": 0},
                                    {"exact": "yes"}, {"seed": -1}, {"wire": "bfloat16"},
                                    {"on_nonfinite": "ignore"}, {"min_compress_numel": -1}])
def test_invalid_settings_rejected_at_construction(kwargs):
    with pytest.raises(ValueError):
        hvdcomp.SketchFusion(**kwargs)


def test_settings_and_shapes():
    s = hvdcomp.SketchFusion()
    assert (s.ratio, s.rows, s.cols, s.width, s.exact, s.wire) == (0.05, 1, None, 2, True,
                                                                    "float16")
    k, rows, cols = s.shape_for(84_480)
    # 3k halves: 0.075 of fp32's bytes
    assert (k, rows, cols) == (4224, 1, 8448) and (rows * cols + k) * 2 / (4 * 84_480) < 0.076
    assert hvdcomp.SketchFusion(0.5, rows=1, cols=600).shape_for(1000) == (500, 1, 600)
    with pytest.raises(ValueError, match="raise cols"):
        hvdcomp.SketchFusion(0.5, cols=100).shape_for(1000)
    assert hvdcomp.SketchFusion.default() is hvdcomp.SketchFusion.compress.__self__


# -- LayerFusion planner -------------------------------------------------------------------------
def _mixed_model():
    """Backward order: a large layer, 40 small ones, a large one, 40 small, a large one; backward
    time proportional to bytes (1 GB/s of compute)."""
    big, small = 16 << 20, 4 << 10
    sizes = [big] + [small] * 40 + [big] + [small] * 40 + [big]
    return sizes, [s / 1e9 for s in sizes]


def test_plan_merges_small_layers_and_separates_large_ones_when_latency_dominates():
    sizes, bwd = _mixed_model()
    lat, bw = 1e-3, 10e9  # 1 ms per message; a large layer takes 1.7 ms on the wire
    plan = fusion.plan_buckets(sizes, bwd, latency=lat, bandwidth=bw)
    assert plan.rule == "dp"
    assert [lo for lo, _ in plan.buckets][0] == 0 and plan.buckets[-1][1] == len(sizes)
    assert all(a[1] == b[0] for a, b in zip(plan.buckets, plan.buckets[1:]))
    big = [i for i, s in enumerate(sizes) if s == sizes[0]]
    owner = {i: j for j, (lo, hi) in enumerate(plan.buckets) for i in range(lo, hi)}
    assert len({owner[i] for i in big}) == 3  # large layers in different buckets
    assert len(plan.buckets) <= 8  # the 80 small layers are merged
    layer = fusion.estimate(fusion.layerwise(len(sizes)), sizes, bwd, lat, bw)
    single = fusion.estimate([(0, len(sizes))], sizes, bwd, lat, bw)
    assert plan.time == pytest.approx(fusion.estimate(plan.buckets, sizes, bwd, lat, bw))
    assert plan.time < single and plan.time < layer / 1.9


def test_plan_is_optimal_on_small_cases():
    """Brute force over all 2**(L-1) splits agrees with the dynamic programming."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        L = 7
        sizes, bwd = rng.integers(1, 10_000, L), rng.uniform(0, 1e-3, L)
        lat, bw = rng.uniform(0, 1e-3), rng.uniform(1e6, 1e8)
        best = math.inf
        for mask in range(2 ** (L - 1)):
            cuts = [0] + [i + 1 for i in range(L - 1) if mask >> i & 1] + [L]
            best = min(best, fusion.estimate(list(zip(cuts, cuts[1:])), sizes, bwd, lat, bw))
        assert fusion.plan_buckets(sizes, bwd, latency=lat, bandwidth=bw).time == pytest.approx(best)


def test_one_bucket_when_bandwidth_infinite_and_latency_large():
    sizes, bwd = _mixed_model()
    plan = fusion.plan_buckets(sizes, bwd, latency=1.0, bandwidth=float("inf"))
    assert plan.buckets == [(0, len(sizes))]


def test_layerwise_when_latency_is_zero_and_compute_is_slow():
    sizes = [1000] * 6
    plan = fusion.plan_buckets(sizes, [1.0] * 6, latency=0.0, bandwidth=1e6)
    assert plan.buckets == fusion.layerwise(6) and plan.time == pytest.approx(6.001)


def test_fallback_without_measurements():
    mb = 1 << 20
    plan = fusion.plan_buckets([3 * mb, 2 * mb, mb, mb, 5 * mb, 100])
    assert plan.rule == "fallback" and plan.buckets == [(0, 2), (2, 5), (5, 6)]
    assert fusion.plan_buckets([1, 2, 3], fallback_bytes=None).buckets == [(0, 3)]
    assert fusion.plan_buckets([]).buckets == []


def test_fit_cost_model():
    x = np.array([1e3, 1e5, 1e6, 4e6])
    lat, bw = fusion.fit_cost_model(x, 2e-4 + x / 5e8)
    assert lat == pytest.approx(2e-4) and bw == pytest.approx(5e8)
    lat, bw = fusion.fit_cost_model([10, 20], [1.0, 1.0])
    assert lat == pytest.approx(1.0) and bw > 1e12


# -- on real MPI ranks ---------------------------------------------------------------------------
@pytest.mark.timeout(200)
def test_three_ranks_identical_and_match_reference():
    res = results(run(3, "sketch_check.py", timeout=180))
    assert sorted(res) == [0, 1, 2]
    for r in res.values():
        assert r["linear"]  # ring-summed sketches == sketch of the summed vectors, exactly
        assert r["same_on_ranks"]  # bit-identical outputs on every rank
        assert r["max_error"] < 1e-5  # vs. the NumPy reference (ranks' sums in another order)
        assert r["conserved"] < 1e-4  # sum of memories + size * applied == sum of a
        assert r["replay"] == [True, True]  # state_dict round trip replays bit for bit
        assert r["planted_hit"] == 50 and r["out_nonzero"] == r["k"]
        assert r["wire"] * 4 / 3 <= r["bytes_sent"] <= r["wire"] * 4 / 3 + 256
        # the default float16 wire: half the bytes (steps 0-2; step 3 overflows: float32)
        assert all(r["wire"] * 2 / 3 <= b <= r["wire"] * 2 / 3 + 256 for b in r["half_bytes"][:3])
        assert r["half_bytes"][3] > r["wire"] * 4 / 3  # float16 tried, then float32
        assert r["half_same"] and r["half_planted"][:3] == [50] * 3  # step 3: the 1e6 one
        assert r["half_error"] <= 1 and r["half_conserved"] <= 1  # within float16's rounding
        assert r["fallback_error"] < 1e-5 and r["fallback_memory_zero"]


@pytest.mark.parametrize("rows", range(1, 12))
def test_median_rows_matches_numpy_median(rows):
    """The min/max network used by unsketch gives np.median's values bit for bit (ties too)."""
    from hvdcomp.methods.sketchfusion.sketch import median_rows
    rng = np.random.default_rng(rows)
    for dtype in (np.float32, np.float64):
        est = rng.standard_normal((rows, 1001)).astype(dtype)
        est[:, :7] = 1.5  # ties
        est[: rows // 2, 7:20] = -2.0
        assert np.array_equal(median_rows(est.copy()), np.median(est, axis=0).astype(dtype))


@pytest.mark.parametrize("n,cols,rows", [(50_000, 2000, 5), (12_345, 700, 3), (999, 1000, 4),
                                         (70_001, 300, 11)])
def test_device_path_on_cpu_tensors_matches_the_host(monkeypatch, n, cols, rows):
    """The device code (``_device_sketch`` / ``_device_unsketch``, which run on CUDA tensors) on
    CPU tensors, blocks of a few chunks: the host's table up to float rounding, the host's
    estimates exactly."""
    monkeypatch.setattr(cs, "DEVICE_BLOCK", 3 * cols)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    h = cs.hashes(n, rows, cols, seed=2)
    table = cs.sketch(x, h)
    dev = cs._device_sketch(torch.from_numpy(x), h).numpy()
    assert np.abs(dev - table).max() <= 1e-5 * np.abs(table).max()
    got, want = cs._device_unsketch(table, h, "cpu").numpy(), cs.unsketch(table, h)
    assert np.allclose(got, want, rtol=0, atol=1e-6) if rows > 9 else np.array_equal(got, want)
