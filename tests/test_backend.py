"""Unit tests of the shared backend kernels (pure functions, NumPy and Torch)."""
import numpy as np
import pytest
import torch

from hvdcomp.backend import bernoulli_mask, mask_words_digits, merge_bits, pack_signs, unpack_signs
from hvdcomp.signs import merge as alg


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 12345])
def test_pack_unpack_roundtrip_numpy_and_torch_agree(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[::5] = 0.0
    if n > 2:
        x[1] = -0.0
    packed = pack_signs(x)
    assert packed.dtype == np.uint8 and packed.size == (n + 7) // 8
    tpacked = pack_signs(torch.from_numpy(x))
    assert np.array_equal(tpacked.numpy(), packed)
    want = np.copysign(1.0, x).astype(np.float32)  # the IEEE sign: -0.0 packs as -1
    assert np.array_equal(unpack_signs(packed, n), want)
    assert np.array_equal(unpack_signs(tpacked, n).numpy(), want)


def test_bit_order_is_msb_first_and_padding_zero():
    x = np.array([1, -1, -1, -1, -1, -1, -1, 1, 1], dtype=np.float32)
    assert list(pack_signs(x)) == [0b10000001, 0b10000000]


def test_merge_takes_own_where_mask_set():
    acc = np.array([0b11110000], dtype=np.uint8)
    own = np.array([0b10101010], dtype=np.uint8)
    mask = np.array([0b11001100], dtype=np.uint8)
    assert merge_bits(acc, own, mask)[0] == 0b10111000  # own's bits where mask is 1
    ref = (acc & ~mask) | (own & mask)
    assert merge_bits(acc, own, mask)[0] == ref[0]
    t = merge_bits(torch.from_numpy(acc), torch.from_numpy(own), torch.from_numpy(mask))
    assert t.numpy()[0] == ref[0]


@pytest.mark.parametrize("p", [0.0, 1.0, 0.5, 1 / 3, 0.25, 0.2, 1 / 7, 0.9])
def test_bernoulli_mask_probability(p):
    nbytes = 1 << 17  # ~1M bits
    m = bernoulli_mask((7, 1, 2, 3), nbytes, p)
    assert m.dtype == np.uint8 and m.size == nbytes
    freq = np.unpackbits(m).mean()
    sd = np.sqrt(p * (1 - p) / (8 * nbytes))
    assert abs(freq - p) <= 6 * sd + 2 ** -24


def test_bernoulli_mask_is_reproducible_and_key_dependent():
    a = bernoulli_mask((1, 2, 3), 999, 1 / 3)
    assert np.array_equal(a, bernoulli_mask((1, 2, 3), 999, 1 / 3))
    assert not np.array_equal(a, bernoulli_mask((1, 2, 4), 999, 1 / 3))
    t = bernoulli_mask((1, 2, 3), 999, 1 / 3, like=torch.zeros(1))
    assert np.array_equal(t.numpy(), a)


def test_mask_digits():
    assert mask_words_digits(0.5, 4) == [1, 0, 0, 0]
    assert mask_words_digits(0.75, 4) == [1, 1, 0, 0]
    assert mask_words_digits(1.0) is None
    with pytest.raises(ValueError):
        mask_words_digits(1.5)


def test_marsit_compensation_arithmetic():
    g = np.array([0.5, -1.0, 0.0, 2.0], dtype=np.float32)
    e = np.array([0.1, 0.1, -0.1, 0.0], dtype=np.float32)
    p = alg.compensate(g, e)
    assert np.allclose(p, [0.6, -0.9, -0.1, 2.0])
    assert alg.l1_scale(p) == pytest.approx(3.6 / 4)
    signs = alg.decode(alg.encode(p), 4)
    assert list(signs) == [1, -1, -1, 1]
    assert np.allclose(p - alg.own_message(p, 0.5), p - 0.5 * signs)
    p_before = p.copy()
    step, mem = alg.apply(signs.copy(), 0.9, p)
    assert np.allclose(step, [0.9, -0.9, -0.9, 0.9])
    assert np.allclose(mem + step, p)  # nothing lost: memory + applied step == compensated grad
    assert np.array_equal(p, p_before) and mem is not p  # p may be the user's gradient
    step2, mem2 = alg.apply(signs.copy(), 0.9, p, p_is_scratch=True)  # in place, same numbers
    assert mem2 is p and np.array_equal(mem2, mem) and np.array_equal(step2, step)
    assert alg.global_scale([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)


@pytest.mark.parametrize("variant", ["global", "hybrid", "local"])
def test_marsit_memory_blends_global_and_local_error(variant):
    """e = p - (1 - a) * step - a * own_scale * sign(p): a = 0 is the global memory, a = 1 the
    local one, the default 'hybrid' lies in between (0.1 of the way to the local one)."""
    a = alg.LOCAL_SHARE[variant]
    assert a == {"global": 0.0, "hybrid": 0.1, "local": 1.0}[variant]
    p = np.array([0.6, -0.9, -0.1, 2.0, 0.0], dtype=np.float32)
    signs = alg.decode(alg.encode(p), 5)
    assert list(signs) == [1, -1, -1, 1, 1]  # sign of +0.0 is +1, as in the message
    merged = np.array([1, 1, -1, -1, 1], dtype=np.float32)  # the merged signs b
    own = alg.own_message(p, 0.5)
    assert np.array_equal(own, 0.5 * signs)
    zeros = np.array([-0.0, 0.0, -1e-30, 1e-30], dtype=np.float32)
    for kind in (np.asarray, torch.from_numpy):  # the own message is the message sent, +-0 too
        own_zeros = alg.own_message(kind(zeros), 2.0, out=kind(np.empty(4, dtype=np.float32)))
        assert np.array_equal(np.asarray(own_zeros), 2.0 * alg.decode(alg.encode(zeros), 4))
        assert list(np.asarray(own_zeros)) == [-2.0, 2.0, -2.0, 2.0]
    for p_is_scratch in (False, True):
        work = p.copy()
        local = alg.own_message(work, a * 0.5) if a else None
        step, mem = alg.apply(merged.copy(), 0.9, work, p_is_scratch, a, local)
        assert np.array_equal(step, np.float32(0.9) * merged)  # exactly +-delta
        assert (mem is work) == p_is_scratch
        assert np.allclose(mem, p - (1 - a) * 0.9 * merged - a * 0.5 * signs, atol=1e-7)
    if a == 1.0:
        assert np.allclose(mem, p - alg.own_message(p, 0.5))


def test_rms_precondition_is_adams_normaliser():
    """u = g / (sqrt(v_hat) + eps) is exactly the step torch.optim.Adam takes with beta1 = 0 and
    lr 1 (same beta2, eps, bias correction); the previous state is not modified; NumPy and Torch
    agree."""
    from hvdcomp.algorithms import precondition as rms
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(50).astype(np.float32) * s for s in (3.0, 0.1, 1.0)]
    param = torch.zeros(50, requires_grad=True)
    adam = torch.optim.Adam([param], lr=1.0, betas=(0.0, rms.BETA2), eps=rms.EPS)
    state = tstate = None
    for g in grads:
        before = param.detach().clone()
        param.grad = torch.from_numpy(g.copy())
        adam.step()
        kept = None if state is None else state[1].copy()
        u, new = rms.step(state, g)
        tu, tstate = rms.step(tstate, torch.from_numpy(g))
        assert np.allclose(u, (before - param.detach()).numpy(), rtol=1e-5, atol=1e-6)
        assert np.allclose(tu.numpy(), u, rtol=1e-6)
        if kept is not None:
            assert np.array_equal(state[1], kept)  # a rolled-back step leaves the state intact
        state = new
    assert state[0] == 3 and np.abs(u).max() < 1 / (1 - rms.BETA2) ** 0.5
