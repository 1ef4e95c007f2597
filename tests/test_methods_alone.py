"""Every method on its own, through the method contract (``hvdcomp.methods.contract``) and an
in-process transport of simulated ranks (tests/inprocess.py): no MPI rank, no Horovod, no step
engine. What each method's math promises, checked in seconds; the real-rank tests check the same
methods under Horovod and DDP."""
import numpy as np
import pytest

import expect
import inprocess
from hvdcomp import registry

METHODS = list(registry.METHODS)
RANKS = 4


def _method(name, **kwargs):
    return lambda: registry.METHODS[name].Method(**kwargs)


def _gradients(shapes, seed=0, ranks=RANKS, noise=0.5):
    """Every rank's tensors: one shared direction plus ``noise`` times the rank's own."""
    rng = np.random.default_rng(seed)
    common = {k: rng.standard_normal(s) for k, s in shapes.items()}
    return [{k: (v + noise * rng.standard_normal(v.shape)).astype(np.float32)
             for k, v in common.items()} for _ in range(ranks)]


def _mean(grads):
    return {k: np.mean([g[k] for g in grads], axis=0).reshape(-1) for k in grads[0]}


def _relative_error(steps, mean):
    return max(np.linalg.norm(np.mean(steps[k], axis=0) - mean[k]) / np.linalg.norm(mean[k])
               for k in mean)


@pytest.mark.parametrize("name", METHODS)
def test_every_rank_takes_the_same_step(name):
    grads = lambda t: _gradients({"w": (48, 40), "b": (3000,)}, seed=t)  # noqa: E731
    out, _ = inprocess.run(_method(name, **expect.EXPECT[name].test_kwargs), grads, steps=4)
    for t, ranks in enumerate(out):
        for k in ranks[0]:
            assert all(np.array_equal(ranks[0][k], ranks[r][k]) for r in range(RANKS)), (t, k)
            assert np.isfinite(ranks[0][k]).all() and ranks[0][k].size == (
                1920 if k == "w" else 3000)


@pytest.mark.parametrize("name", METHODS)
def test_on_one_rank_the_result_is_the_documented_one(name):
    """What tests/mpi/one_rank.py checks through Horovod's direct allreduce (not an optimizer's
    gradient): the tensor itself, its sign, or its sign at the mean magnitude."""
    g = _gradients({"g": (3000,)}, ranks=1)
    e = expect.EXPECT[name]
    out, _ = inprocess.run(_method(name, **e.one_rank_kwargs), g, gradient=False)
    x = g[0]["g"]
    want = {"identity": x, "sign": np.sign(x),
            "scaled-sign": np.abs(x).mean() * np.sign(x)}[e.one_rank]
    assert np.allclose(out[0][0]["g"], want, rtol=1e-5, atol=1e-6)


ESTIMATES_THE_MEAN = [m for m in METHODS
                      if registry.METHODS[m].Method.returns_step is None and m != "EFSignSGD"]


@pytest.mark.parametrize("name", ESTIMATES_THE_MEAN)
def test_error_feedback_returns_what_a_step_left_out(name):
    """The same gradients step after step: one step misses the mean by far, the average of 200
    steps comes within 15% of it (what each step leaves out is carried into the next)."""
    grads = _gradients({"w": (64, 128), "b": (4096,)})
    out, _ = inprocess.run(_method(name, **expect.EXPECT[name].test_kwargs), grads, steps=200)
    mean = _mean(grads)
    steps = {k: [out[t][0][k] for t in range(200)] for k in mean}
    first = _relative_error({k: v[:1] for k, v in steps.items()}, mean)
    assert _relative_error(steps, mean) < min(0.15, first / 4)


def test_efsignsgd_steps_by_the_ranks_majority_vote():
    grads = _gradients({"g": (5000,)})
    out, _ = inprocess.run(_method("EFSignSGD"), grads)
    vote = np.sign(sum(np.sign(g["g"]) for g in grads))  # 0 where the ranks tie
    assert np.array_equal(np.sign(out[0][0]["g"]), vote) and (vote == 0).any()


def test_binsgdm_steps_along_the_mean_gradient_by_its_votes():
    grads = _gradients({"g": (8192,)})
    out, _ = inprocess.run(_method("BinSGDM"), grads, steps=60)
    mean = _mean(grads)["g"]
    agree = np.mean([np.sign(out[t][0]["g"]) == np.sign(mean) for t in range(30, 60)])
    assert agree > 0.75  # random signs agree half the time
    assert len(np.unique(np.abs(out[-1][0]["g"]))) <= RANKS + 1  # a vote: a few magnitudes


@pytest.mark.parametrize("name", METHODS)
def test_each_rank_sends_the_methods_saving_over_an_fp32_ring(name):
    """Bytes each rank sends per step, against an fp32 ring all-reduce's ``2 (N-1)/N * 4`` bytes
    per element: at least the saving the method promises (tests/expect.py ``min_ratio``; a
    1-bit vote at least 4x where none is stated)."""
    grads = _gradients({"w": (256, 256)})
    _, ctxs = inprocess.run(_method(name), grads, steps=3)
    fp32 = 2 * (RANKS - 1) / RANKS * 4 * 256 * 256
    saving = min(fp32 / (c.stats.bytes_sent / 3) for c in ctxs)
    assert saving >= (expect.EXPECT[name].min_ratio or 4), saving


@pytest.mark.parametrize("name", sorted(expect.ROUNDS))
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_a_step_takes_the_methods_rounds(name, ranks):
    grads = _gradients({"w": (256, 256)}, ranks=ranks)
    _, ctxs = inprocess.run(_method(name), grads, steps=2)
    gathers = 2  # the scalars' all-gather of each step (inprocess.run)
    assert max(c.stats.rounds for c in ctxs) == 2 * expect.ROUNDS[name](ranks) + gathers
