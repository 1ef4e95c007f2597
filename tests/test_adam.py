"""precondition='adam' (hvdcomp.algorithms.adam): pure-function checks. The multi-rank behaviour
is tested on real ranks elsewhere: training and checkpoint resume in test_training.py, TensorFlow
resume in test_tensorflow.py, a NaN in the warm-up in test_bad_input.py."""
import math

import numpy as np
import pytest
import torch

import hvdcomp
from hvdcomp.algorithms import adam


def test_dense_steps_are_torch_adam():
    """With warmup = inf (every step dense) the returned direction is exactly the step of
    torch.optim.Adam at lr 1 on the same (mean) gradients; NumPy and Torch agree; the previous
    state is never modified (a step that does not land leaves it intact)."""
    settings = adam.AdamSettings(warmup=math.inf)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(40).astype(np.float32) * s for s in (3.0, 0.1, 1.0, 0.5)]
    param = torch.zeros(40, requires_grad=True)
    ref = torch.optim.Adam([param], lr=1.0, betas=settings.betas, eps=settings.eps)
    state = tstate = None
    for g in grads:
        assert adam.is_dense(state, settings)
        assert adam.message(state, g, settings) is g  # the gradient itself is sent
        before = param.detach().clone()
        param.grad = torch.from_numpy(g.copy())
        ref.step()
        kept = None if state is None else [x.copy() for x in state[1:]]
        u, new = adam.update(state, g, True, settings)
        tu, tstate = adam.update(tstate, torch.from_numpy(g), True, settings)
        assert np.allclose(u, (before - param.detach()).numpy(), rtol=1e-5, atol=1e-6)
        assert np.allclose(tu.numpy(), u, rtol=1e-6)
        if kept is not None:
            assert all(np.array_equal(a, b) for a, b in zip(state[1:], kept))
        state = new
    assert state[0] == 4


def test_after_warmup_the_momentum_is_sent_and_the_mean_becomes_the_momentum():
    settings = adam.AdamSettings(betas=(0.8, 0.99), warmup=2)
    rng = np.random.default_rng(1)
    state = None
    for _ in range(2):
        assert adam.is_dense(state, settings)
        _, state = adam.update(state, rng.standard_normal(30).astype(np.float32), True, settings)
    assert not adam.is_dense(state, settings)
    t, m, v = state
    g = rng.standard_normal(30).astype(np.float32)
    sent = adam.message(state, g, settings)
    assert np.allclose(sent, 0.8 * m + 0.2 * g, rtol=1e-6)
    reduced = rng.standard_normal(30).astype(np.float32)  # stands for the compressed mean
    u, (t2, m2, v2) = adam.update(state, reduced, False, settings)
    assert t2 == 3 and np.array_equal(m2, reduced) and m2 is not reduced
    assert np.allclose(v2, 0.99 * v + 0.01 * reduced ** 2, rtol=1e-6)
    expect = (reduced / (1 - 0.8 ** 3)) / (np.sqrt(v2 / (1 - 0.99 ** 3)) + settings.eps)
    assert np.allclose(u, expect, rtol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(warmup=0), dict(warmup=2.5), dict(warmup=True),
                                    dict(betas=(0.9, 1.0)), dict(betas=0.9), dict(eps=0.0)])
def test_bad_settings_raise(kwargs):
    with pytest.raises(ValueError):
        adam.AdamSettings(**kwargs)


def test_precondition_argument():
    assert hvdcomp.Marsit(precondition="adam").adam.warmup == adam.WARMUP
    custom = hvdcomp.AdamSettings(warmup=20)
    comp = hvdcomp.TopK(precondition=custom)
    assert comp.precondition == "adam" and comp.adam is custom
    assert hvdcomp.SketchFusion(precondition="rms").adam is None
    with pytest.raises(ValueError, match="precondition"):
        hvdcomp.Marsit(precondition="adamw")


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_preconditioners_give_the_same_bits_into_kept_buffers(kind):
    """adam.message / adam.update and the 'rms' step, written into kept buffers (what the
    preconditioners do in a steady step, allocating nothing), give the bits of their fresh-array
    form, leave the previous state intact, and (adam.update) write u into the reduced mean."""
    from hvdcomp.algorithms import precondition as rms
    settings = adam.AdamSettings(betas=(0.8, 0.99), warmup=2)
    rng = np.random.default_rng(2)
    wrap = (lambda a: a) if kind == "numpy" else torch.from_numpy
    host = (lambda a: a) if kind == "numpy" else (lambda t: t.numpy())

    def fresh(n):
        return wrap(np.full(n, np.nan, np.float32))  # garbage: every element must be written

    state = rstate = None
    for step in range(4):
        g, reduced = (wrap(rng.standard_normal(64).astype(np.float32)) for _ in range(2))
        kept = None if state is None else [host(x).copy() for x in state[1:]]
        sent = adam.message(state, g, settings)
        sent_kept = adam.message(state, g, settings, out=(fresh(64), fresh(64)))
        assert np.array_equal(host(sent), host(sent_kept))
        dense = adam.is_dense(state, settings)
        u, new = adam.update(state, reduced, dense, settings)
        into = reduced.copy() if kind == "numpy" else reduced.clone()
        u_kept, new_kept = adam.update(state, into, dense, settings,
                                       out=(fresh(64), fresh(64), fresh(64)))
        assert u_kept is into and np.array_equal(host(u), host(u_kept)), step
        assert all(np.array_equal(host(a), host(b)) for a, b in zip(new[1:], new_kept[1:]))
        if kept is not None:
            assert all(np.array_equal(host(a), b) for a, b in zip(state[1:], kept))
        state = new_kept
        r_u, r_new = rms.step(rstate, g)
        r_u_kept, r_new_kept = rms.step(rstate, g, out=(fresh(64), fresh(64)))
        assert np.array_equal(host(r_u), host(r_u_kept))
        assert np.array_equal(host(r_new[1]), host(r_new_kept[1]))
        rstate = r_new_kept


class _Moments:
    """The user's Adam moments of one tensor, as the adapters' ``AdamMoments`` present them."""
    beta1, beta2 = 0.9, 0.999

    def __init__(self, exp_avg):
        self.m = exp_avg

    def steps(self):
        return 50

    def exp_avg(self, like):
        return self.m

    def set_exp_avg(self, momentum):
        self.m = np.array(momentum, copy=True)


class _Entry:
    def __init__(self, key, work, adam):
        self.key, self.work, self.adam = key, work, adam
        self.dense, self.status, self.numel = False, hvdcomp.checks.OK, work.size


@pytest.mark.parametrize("increment", [False, True])
def test_under_the_users_adam_the_momentum_or_its_increment_is_sent(increment):
    """FollowAdam sends each rank's momentum ``b1 m + (1-b1) g_r``, or with ``increment`` only
    ``(1-b1) g_r`` and adds ``b1 m`` (the same on every rank) to the mean: either way the mean of
    an exact reduction is Adam's momentum of the mean gradient, which lands as Adam's
    ``exp_avg``; PowerSGD sends the increment, at rank 8 under Adam."""
    from hvdcomp import preconditioning
    from hvdcomp.state import StateStore
    rng = np.random.default_rng(1)
    m = rng.standard_normal(30).astype(np.float32)
    grads = [rng.standard_normal(30).astype(np.float32) for _ in range(4)]
    sent = []
    for g in grads:
        pre = preconditioning.FollowAdam(increment=increment)
        e = _Entry("w", g.copy(), _Moments(m))
        pre.before([e], StateStore())
        sent.append(e.work.copy())
    shared = 0.0 if increment else 0.9 * m
    assert all(np.allclose(s, 0.1 * g + shared, atol=1e-6) for s, g in zip(sent, grads))
    moments = _Moments(m)
    pre, e = preconditioning.FollowAdam(increment=increment), _Entry("w", grads[0], moments)
    reduced = {"w": np.mean(sent, axis=0)}
    pre.before([e], StateStore())
    pre.after([e], reduced, StateStore(), None)
    pre.land()
    want = 0.9 * m + 0.1 * np.mean(grads, axis=0)
    assert np.allclose(reduced["w"], want, atol=1e-6) and np.allclose(moments.m, want, atol=1e-6)
    powersgd = hvdcomp.PowerSGD.Method
    assert isinstance(preconditioning.make(None, powersgd.under_adam), preconditioning.FollowAdam)
    assert preconditioning.make(None, powersgd.under_adam).increment
    assert [powersgd().rank_of(_Entry("w", g, a)) for a in (None, moments)] == [4, 8]
    assert powersgd(rank=2).rank_of(_Entry("w", g, moments)) == 2
