"""hvdcomp.kernels: the fused numba kernels against the NumPy reference path they replace.

Tolerance: none. Every comparison is bit for bit (packed bytes, l1 sums, steps, memories,
selected indices and values), since the kernels do the reference's float operations in the
same order (the l1 sum in NumPy's own pairwise order)."""
import numpy as np
import pytest

from hvdcomp import kernels
from hvdcomp.signs import merge as alg
from hvdcomp.backend import pack_signs
from hvdcomp.backend import topk as sel
from hvdcomp.methods.efsignsgd.method import majority_step, own_error, vote_total

pytest.importorskip("numba")
from hvdcomp.signs import kernels as signs  # noqa: E402
from hvdcomp.kernels import topk as fused_topk  # noqa: E402
from hvdcomp.kernels.topk import SumSource  # noqa: E402
from hvdcomp.signs import KERNELS as SIGNS  # noqa: E402

LENGTHS = [0, 1, 7, 8, 9, 127, 128, 129, 1000, 8191, 8192, 8193, 100_003]
DTYPES = [np.float32, np.float64]


def _same(a, b):
    """Bit-identical arrays (signed zeros included)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _vectors(n, dtype, seed):
    """``(g, e)`` with zeros of both signs, ties and a wide range of magnitudes."""
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * rng.exponential(1.0, n)).astype(dtype)
    e = (0.1 * rng.standard_normal(n)).astype(dtype)
    special = np.array([0.0, -0.0, 0.0, -0.0, 1.0, -1.0], dtype=dtype)
    m = min(n, special.size)
    g[:m], e[:m] = special[:m], special[::-1][:m] * 0
    return g, e


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_encode_matches_reference(n, dtype):
    """p = g + e, the packed bits (-0.0 packs as 0, unused bits 0) and np.abs(p).sum()."""
    g, e = _vectors(n, dtype, n)
    p, bits = np.full_like(g, np.nan), np.full((n + 7) // 8, 0xAA, np.uint8)
    total = signs.encode(g, e, p, bits)
    want = g + e
    assert _same(p, want) and _same(bits, pack_signs(want))
    assert total == float(np.abs(want).sum())
    total = signs.encode(g, None, None, bits)  # first step: no memory, p is g
    assert _same(bits, pack_signs(g)) and total == float(np.abs(g).sum())


def test_encode_views_and_all_negative_zeros():
    g, e = _vectors(20_001, np.float32, 3)
    for lo in (1, 3, 8):  # unaligned views (contiguous)
        gv, ev = g[lo:], e[lo:]
        p, bits = np.empty_like(gv), np.empty((gv.size + 7) // 8, np.uint8)
        assert signs.encode(gv, ev, p, bits) == float(np.abs(gv + ev).sum())
        assert _same(bits, pack_signs(gv + ev))
    z = np.full(13, -0.0, np.float32)
    bits = np.empty(2, np.uint8)
    assert signs.encode(z, None, None, bits) == 0.0 and list(bits) == [0, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(alg.LOCAL_SHARE))
@pytest.mark.parametrize("n", [1, 9, 1000, 8193])
def test_marsit_decode_matches_apply(n, variant, dtype):
    """step = delta * b and the memory of every compensation variant, in place or not."""
    g, e = _vectors(n, dtype, 7)
    p = g + e
    merged = pack_signs(np.random.default_rng(n).standard_normal(n))
    share, own, delta = alg.LOCAL_SHARE[variant], 0.37, 0.61
    for in_place in (False, True):
        local = alg.own_message(p, share * own) if share else None
        want_step, want_mem = alg.apply(alg.decode(merged, n, np.dtype(dtype).name), delta,
                                        p.copy(), True, share, local)
        step = np.empty_like(p)
        src = p.copy()
        mem = src if in_place else np.empty_like(p)
        signs.marsit_decode(merged, src, delta, alg.memory_factor(delta, share),
                            share * own if share else None, step, mem)
        assert _same(step, want_step) and _same(mem, want_mem)


def test_marsit_decode_zero_scales_keep_signed_zeros():
    p = np.array([0.0, -0.0, 0.0, -0.0, 1.0], np.float32)
    merged = np.array([0b10100000], np.uint8)
    for share in (0.0, 0.1, 1.0):
        local = alg.own_message(p, 0.0) if share else None
        want = alg.apply(alg.decode(merged, 5), 0.0, p.copy(), True, share, local)
        step, mem = np.empty_like(p), np.empty_like(p)
        signs.marsit_decode(merged, p, 0.0, alg.memory_factor(0.0, share),
                            0.0 if share else None, step, mem)
        assert _same(step, want[0]) and _same(mem, want[1])


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [5, 64, 1001])
def test_vote_decode_matches_majority_step_and_own_error(ranks, n):
    rng = np.random.default_rng(ranks * n)
    p = (rng.standard_normal(n) * (rng.random(n) > 0.1)).astype(np.float32)
    p[:2] = [-0.0, 0.0]
    nb = (n + 7) // 8
    rows = np.stack([np.concatenate([rng.integers(0, 256, 3, dtype=np.uint8),
                                     pack_signs(rng.standard_normal(n)), [0]])
                     for _ in range(ranks)]).astype(np.uint8)
    scale, own = np.float64(0.8), 0.45
    step, mem = np.empty_like(p), np.empty_like(p)
    signs.vote_decode(rows, 3, p, scale, own, step, mem)
    want = majority_step(vote_total(rows[:, 3:3 + nb], n), scale)
    assert _same(step, want)
    assert _same(mem, own_error(p, own, False, np.empty_like(p)))


def _topk_data(kind, n, seed):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "sparse":  # a huge tie at 0
        x = np.zeros(n, np.float32)
        x[rng.choice(n, n // 200, replace=False)] = rng.standard_normal(n // 200)
        return x
    if kind == "integers":  # many exact ties
        return rng.integers(-5, 6, n).astype(np.float32)
    return rng.standard_cauchy(n).astype(np.float32)


@pytest.mark.parametrize("kind", ["normal", "sparse", "integers", "cauchy"])
@pytest.mark.parametrize("n,k", [(200_000, 2000), (100_000, 1), (70_000, 35_000), (5000, 50)])
@pytest.mark.parametrize("method", ["approx", "exact"])
def test_topk_sum_source_selects_what_the_reference_selects(kind, n, k, method):
    """Same indices, values and accumulated vector as compensating first, then selecting."""
    g, e = _topk_data(kind, n, 1), _topk_data(kind, n, 2) * np.float32(0.3)
    want = sel.select_topk(g + e, k, method, seed=11)
    for capacity in (2 * k + 64, 1):  # 1: the scan overflows and is redone on the sum
        out = np.full_like(g, np.nan)
        src = SumSource(g, e, out, capacity)
        got = sel.select_topk(src, k, method, seed=11)
        assert _same(got[0], want[0]) and _same(got[1], want[1])
        assert _same(src.array(), g + e)
    first = sel.select_topk(SumSource(g, None, None, 1), k, method, seed=11)  # no memory yet
    ref = sel.select_topk(g, k, method, seed=11)
    assert _same(first[0], ref[0]) and _same(first[1], ref[1])


@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize("vdt", [np.float32, np.float64])
@pytest.mark.parametrize("na,nb,shared", [(0, 0, 0), (0, 40, 0), (40, 0, 0), (5000, 3000, 1000),
                                          (3000, 3000, 3000), (1, 1, 1)])
def test_topk_set_merges_match_the_reference(idt, vdt, na, nb, shared):
    """The exchange's pair sum and ``won``: the reference's indices, values (a + b at shared
    indices, bit for bit) and masks, including empty and identical sets."""
    from hvdcomp.methods.topk import math as talg
    rng = np.random.default_rng(na + nb + shared)
    pool = rng.permutation(50 * (na + nb) + 2)
    ai = np.sort(pool[:na]).astype(idt)
    bi = np.sort(np.concatenate([pool[na:na + nb - shared], rng.choice(ai, shared, False)
                                 if shared else pool[:0]])).astype(idt)
    a = (ai, rng.standard_normal(ai.size).astype(vdt))
    b = (bi, rng.standard_normal(bi.size).astype(vdt))
    want, got = talg.sum_sets([a, b]), fused_topk.sum_pair(a, b)
    assert _same(got[0], want[0]) and _same(got[1], want[1])
    for x, y in ((ai, bi), (bi, ai), (ai, ai)):
        assert np.array_equal(fused_topk.won(x, y), talg.won(x, y))
    bounds, ks = [0, pool.size // 2, pool.size], [max(1, na // 3), 7]
    merged = talg.TopKMerge(bounds, ks, fused_topk.sum_pair)(a, b)
    ref = talg.TopKMerge(bounds, ks)(a, b)
    assert _same(merged[0], ref[0]) and _same(merged[1], ref[1])


def test_switch(monkeypatch):
    x = np.zeros(16, np.float32)
    kernels.warm(SIGNS)
    monkeypatch.setenv(kernels.ENV, "numpy")
    assert kernels.mode() == "numpy" and not kernels.active(SIGNS, x)
    monkeypatch.setenv(kernels.ENV, "numba")
    assert kernels.active(SIGNS, x) and kernels.active(SIGNS, x, None)
    assert not kernels.active(SIGNS, x[::2]) and not kernels.active(SIGNS, x.astype(np.float16))
    assert not kernels.active(SIGNS, x, x.astype(np.float64))
    assert not kernels.active(SIGNS, x.reshape(4, 4))
    assert not kernels.active("no-such-kernels", x)  # not loaded: the reference path
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(ValueError):
        kernels.mode()


@pytest.mark.timeout(900)
# Marsit (the sign kernels EF-signSGD shares) and BinSGDM (both legs), in one launch per path, on
# 2 nodes of 2 ranks; EF-signSGD's vote decode and TopK's fused scan are compared bit for bit above
@pytest.mark.parametrize("name", ["Marsit", "BinSGDM"])
def test_training_is_bit_identical_with_either_path(name):
    """4 real ranks (2 nodes: Marsit between the nodes, BinSGDM's both legs), the stock
    horovod.torch optimizer, 5 epochs (55 steps): the run with the fused kernels and the run
    with HVDCOMP_KERNELS=numpy end in the same model (accuracy and loss to the last bit)."""
    from conftest import train_digits
    from hvdcomp import registry
    cases = tuple((registry.base_preset(m), 5) for m in ("Marsit", "BinSGDM"))
    preset, env = registry.base_preset(name), {"HVDCOMP_RANKS_PER_NODE": "2"}
    fused = train_digits(preset, env={**env, kernels.ENV: "numba"}, epochs=5, launched_with=cases)
    ref = train_digits(preset, env={**env, kernels.ENV: "numpy"}, epochs=5, launched_with=cases)
    assert (fused[0]["acc"], fused[0]["loss"]) == (ref[0]["acc"], ref[0]["loss"])


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 100_003])
@pytest.mark.parametrize("first", [True, False])
def test_binsgdm_moments_and_votes_match_the_reference(n, first):
    """One pass of ``votes.moments_votes`` = update_moments + direction + binarise (the votes
    drawn from the counter stream at the fused position), and the total of the new v, bit for
    bit, at an offset, with any size of the probabilities' block buffer."""
    from hvdcomp.methods.binsgdm import math as bs
    from hvdcomp.methods.binsgdm import stochastic
    from hvdcomp.methods.binsgdm import kernels as kv
    g, _ = _vectors(n, np.float32, 5)
    state = None if first else (g[::-1].copy() * 0.5, np.abs(g) + np.float32(0.1))
    b1, b2, eps, key, off = 0.9, 0.99, 1e-8, (3, 4, 1, bs.VOTE), 17
    m, v = bs.update_moments(g, state, b1, b2)
    want = np.full(n + off, 7, np.int8)
    u = np.concatenate([np.zeros(off, np.float32), bs.direction(m, v, eps)])
    want[off:] = bs.binarise(u, key)[off:]
    c = [np.float32(x) for x in (b1, 1 - b1, b2, 1 - b2, eps)]
    words = [np.uint32(w) for w in stochastic.words(key)]
    for block in (g.size, 3, kv.PROBABILITY_BLOCK):  # whole, odd-sized and the kernel's blocks
        got, m_out, v_out = np.full(n + off, 7, np.int8), np.empty_like(g), np.empty_like(g)
        v_total = kv.moments_votes(g, *(state or (None, None)), *c, *words, off, m_out, v_out,
                                   np.empty(block, g.dtype), got, np.full(bs.LANES, 5.0))
        assert _same(m_out, m) and _same(v_out, v) and _same(got[off:], want[off:]), block
        assert v_total == bs.total(v), block
        assert (got[:off] == 7).all()


@pytest.mark.parametrize("n", [1, 9, 100_003])
@pytest.mark.parametrize("first", [True, False])
def test_binsgdm_moments_and_direction_match_the_reference(n, first):
    """``votes.moments_direction`` (BinSGDM's step aside) = update_moments + direction, and the
    total of the new v, bit for bit."""
    from hvdcomp.methods.binsgdm import math as bs
    from hvdcomp.methods.binsgdm import kernels as kv
    g, _ = _vectors(n, np.float32, 6)
    state = None if first else (g[::-1].copy() * 0.5, np.abs(g) + np.float32(0.1))
    b1, b2, eps = 0.5, 0.99, 1e-8
    m, v = bs.update_moments(g, state, b1, b2)
    c = [np.float32(x) for x in (b1, 1 - b1, b2, 1 - b2, eps)]
    m_out, v_out, u_out = np.empty_like(g), np.empty_like(g), np.empty_like(g)
    v_total = kv.moments_direction(g, *(state or (None, None)), *c, m_out, v_out, u_out,
                                   np.full(bs.LANES, 5.0))
    assert _same(m_out, m) and _same(v_out, v) and _same(u_out, bs.direction(m, v, eps))
    assert v_total == bs.total(v)


@pytest.mark.parametrize("node_size,nodes", [(1, 2), (2, 2), (3, 4)])
def test_binsgdm_rebinarise_totals_and_mean_match_the_reference(node_size, nodes):
    from hvdcomp.methods.binsgdm import math as bs
    from hvdcomp.methods.binsgdm import stochastic
    from hvdcomp.methods.binsgdm import kernels as kv
    n, key = 10_007, (1, 2, 0, bs.REBINARISE)
    rng = np.random.default_rng(node_size)
    node_sum = (2 * rng.binomial(node_size, 0.6, n) - node_size).astype(np.int8)
    packed = np.empty(-(-n // 8), np.uint8)
    kv.rebinarise_packed(node_sum, node_size, kv.rebinarise_thresholds(node_size),
                         *[np.uint32(w) for w in stochastic.words(key)], packed)
    assert _same(packed, pack_signs(bs.rebinarise(node_sum, node_size, key)))
    messages = rng.integers(0, 256, (nodes, packed.size), dtype=np.uint8)
    messages[:, -1] &= np.uint8(0xFF << (8 - n % 8) & 0xFF)
    from hvdcomp.backend import unpack_signs
    want = bs.node_votes_total([unpack_signs(r, n, "int8") for r in messages], node_size,
                               np.int16)
    got = np.empty(n, np.int16)
    kv.node_totals(messages, n, node_size, got)
    assert _same(got, want)
    mean = np.empty(n, np.float32)
    kv.mean_vote(want, nodes * node_size, np.float32(1.0), mean)
    assert _same(mean, bs.mean_vote(want, nodes * node_size))
    scaled = bs.mean_vote(want, nodes * node_size)
    np.multiply(scaled, 0.0123, out=scaled)  # the reference's scale under SGD (a Python float)
    kv.mean_vote(want, nodes * node_size, np.float32(0.0123), mean)
    assert _same(mean, scaled)


@pytest.mark.parametrize("n,cols,rows", [(50_000, 2000, 5), (12_345, 700, 3), (999, 1000, 4),
                                         (70_001, 300, 9), (7, 3, 1), (100_003, 1000, 3)])
def test_sketch_and_unsketch_match_the_reference(n, cols, rows):
    """``kernels.sketch``: the one-pass table is the reference's bit for bit; ``unsketch``:
    every position's median estimate, the reference's values."""
    from hvdcomp.methods.sketchfusion import sketch as cs
    from hvdcomp.methods.sketchfusion import kernels as ks
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    h = cs.hashes(n, rows, cols, seed=4)
    table = cs.sketch(x, h)
    fused = np.zeros_like(table)
    ks.sketch(x, h.offsets, h.chunk_signs, fused)
    assert _same(fused, table)
    out = np.full(n, np.nan, np.float32)
    ks.unsketch(table, h.offsets, h.chunk_signs, n, out)
    assert np.array_equal(out, cs.unsketch(table, h))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 1000, 8193])
def test_finite_at_address_matches_numpy(n, dtype):
    """``kernels.finite.all_finite_at``: what ``np.isfinite(x).all()`` says, for NaN, +Inf and
    -Inf at the first, a middle and the last position, and for the largest finite values (which
    a sum of squares would overflow); the torch adapter's check gives the same through a CPU
    tensor's address (once the kernel is loaded, as the step engine loads it)."""
    from hvdcomp.kernels.finite import all_finite_at
    torch = pytest.importorskip("torch")
    from hvdcomp.facade.frontends import torch as adapter
    kernels.warm("finite")

    def finite(x):
        return all_finite_at(x.ctypes.data, x.size, x.itemsize)

    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    assert finite(x) is True and adapter.all_finite(torch.from_numpy(x))
    if n:
        big = np.full(n, np.finfo(dtype).max, dtype)
        assert finite(big) and adapter.all_finite(torch.from_numpy(big))
        for bad in (np.nan, np.inf, -np.inf):
            for pos in {0, n // 2, n - 1}:
                y = x.copy()
                y[pos] = bad
                assert finite(y) is False and not adapter.all_finite(torch.from_numpy(y))
    with pytest.raises(ValueError):
        all_finite_at(x.ctypes.data, n, 2)


@pytest.mark.timeout(200)
def test_a_job_that_passes_every_gradient_never_loads_numba():
    """2 real ranks through the stock DistributedOptimizer: passing every gradient, PowerSGD
    (no kernels of its own) with ``on_nonfinite='skip'`` (every tensor Horovod sums checked at
    every step) and then Marsit, the job never imports numba (~1 s per process), and the
    check still catches rank 1's NaN: one step skipped on both ranks, which stay bit-identical;
    Marsit compressing for good loads its kernels and the finite check's."""
    from mpirun import results, run
    res = results(run(2, "numba_deferred.py", timeout=150))
    assert sorted(res) == [0, 1]
    for r in res.values():
        assert r["powersgd-pass"] == {"identical": 20, "skipped": 1, "numba": False,
                                      "loaded": []}, r
        assert r["marsit-pass"] == {"identical": 20, "skipped": 0, "numba": False,
                                    "loaded": []}, r
        assert r["marsit-compress"] == {"identical": 4, "skipped": 0, "numba": True,
                                        "loaded": ["finite", SIGNS]}, r
