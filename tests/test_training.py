"""Every hvdcomp method through the stock horovod.torch DistributedOptimizer on real MPI ranks:
training reaches the uncompressed result within a stated tolerance with bit-identical ranks after
every step, and a checkpoint resumes bit for bit."""
import pytest

import expect
from hvdcomp import registry
from mpirun import results, run, shared

from conftest import SETTINGS, train_digits
from variants import method_of

TOLERANCE_ACC, TOLERANCE_LOSS = 0.05, 0.25  # accuracy points and absolute test loss

# Every method of hvdcomp/registry.py, by its base preset or a test-local stand-in
# (tests/variants.py; '-bare': the class itself, i.e. its default instance), with the byte
# saving its expect.EXPECT states; methods with EXPECT.min_ratio None are trained by their own
# test (BinSGDM: tests/test_binsgdm.py, on 2 x 2 nodes). Extra variants after them.
STAND_INS = {"TopK": "topk-bare", "SketchFusion": "sketchfusion-bare"}
# (The variant "sketchfusion-narrow", ratio 0.02 with 3 x 4k, was trained here too while the
# default sketch was 5 x 10k; the default is now the narrower one.)
TRAINING = [(STAND_INS.get(m, registry.base_preset(m)), expect.EXPECT[m].min_ratio)
            for m in registry.METHODS if expect.EXPECT[m].min_ratio is not None]
# The resume test: every method in both state forms, unless a stand-in is named here.
RESUME_STAND_INS = {"BinSGDM": [("binsgdm", "gathered")],
                    "SketchFusion": [("sketchfusion-narrow", "rank"),
                                     ("sketchfusion-narrow", "gathered")]}
RESUME = [case for m in registry.METHODS for case in RESUME_STAND_INS.get(
    m, [(registry.base_preset(m), form) for form in ("rank", "gathered")])] + [
    ("marsit-rms", "rank"), ("topk-rms", "gathered"), ("marsit-adam-w4", "rank"),
    ("topk-adam-w8", "gathered")]
# SketchFusion's earlier default sketch (3 x 2k at 1%) was sparse and noisy: it reached the
# 20-epoch uncompressed model in 40 epochs (20 epochs: ~0.80-0.84 accuracy); the default is now 5%
# (trained 40 epochs here still). TopK's default (1% of each tensor) is at 0.906 after 20 epochs on an
# AVX-512/AMX Xeon (torch's kernels round differently there; the uncompressed model: 0.964) and
# at 0.969 after 30
EPOCHS = {"sketchfusion-bare": 40, "topk-bare": 30}
LARGE = ["0.weight", "2.weight", "4.weight"]  # the digits model's tensors of >= 1024 elements
EVERY = sorted(f"{layer}.{p}" for layer in (0, 2, 4) for p in ("weight", "bias"))


# One launch trains every case of this module (the first test to ask pays it).
TRAINED = tuple((name, EPOCHS.get(name, 20)) for name, _ in TRAINING) + (("marsit-adam", 20),)


@pytest.mark.timeout(700)  # above train_launch's own MPI timeout (630 s here)
@pytest.mark.parametrize("name, min_ratio", TRAINING)
def test_training_matches_uncompressed(uncompressed, name, min_ratio):
    res = train_digits(name, epochs=EPOCHS.get(name, 20), launched_with=TRAINED)
    r = res[0]
    print(f"uncompressed acc {uncompressed['acc']:.4f} loss {uncompressed['loss']:.4f}; "
          f"{name} acc {r['acc']:.4f} loss {r['loss']:.4f}, {r['stats']['ratio']:.1f}x fewer bytes")
    assert r["acc"] >= uncompressed["acc"] - TOLERANCE_ACC
    assert r["loss"] <= uncompressed["loss"] + TOLERANCE_LOSS
    # state of the compressed tensors only, unless the method compresses every tensor
    want = expect.EXPECT[method_of(name)]
    assert r["memory_keys"] == want.state_keys(LARGE if want.small_exact else EVERY)
    assert r["stats"]["compressed_elements"] > 0.99 * r["stats"]["elements"]
    assert min(x["stats"]["ratio"] for x in res.values()) > min_ratio
    # rounds per step: the agreement's all-gather, the scalars' (a method that has any), the
    # method's own (tests/expect.py ROUNDS, one node of 4 ranks)
    method = registry.METHODS[method_of(name)].Method
    rounds = max(x["stats"]["rounds"] / x["stats"]["steps"] for x in res.values())
    assert rounds == 1 + (method.n_scalars > 0) + expect.ROUNDS[method.name](4), rounds


@shared
def resume_launch(cases, ranks=3, nodes=None):
    """One launch of tests/mpi/resume.py on ``ranks`` ranks for every ``(name, form)`` of
    ``cases`` (at each test's rates; ``nodes``: HVDCOMP_RANKS_PER_NODE, or None)."""
    args = [a for name, form in cases for a in (name, form, *SETTINGS[name])]
    env = None if nodes is None else {"HVDCOMP_RANKS_PER_NODE": str(nodes)}
    return run(ranks, "resume.py", *args, timeout=60 + 15 * len(cases), env=env)


@pytest.mark.timeout(400)  # the first of these pays the launch of every case
@pytest.mark.parametrize("name, form", RESUME)
def test_checkpoint_resume_is_bit_identical(name, form):
    res = results(resume_launch(tuple(RESUME)), case=f"{name}-{form}")
    assert sorted(res) == [0, 1, 2]
    for r in res.values():
        assert r["identical_steps"] == 12 and r["step"] == 12
        assert r["same"], "resumed run diverged from the uninterrupted one"
        assert r["fresh_differs"], "losing the compressor state should change the trajectory"
        assert r["memory_norm"] > 0 and r["memory_keys"]
    assert len({r["memory_norm"] for r in res.values()}) == 3  # per-rank states really differ
    for kind in ("rms", "adam"):  # the preconditioner's state of every gradient, biases included
        if f"-{kind}" in name:
            keys = res[0]["memory_keys"]
            assert {k for k in keys if k.endswith(f"#{kind}")} == {
                f"{layer}.{p}#{kind}" for layer in (0, 2, 4) for p in ("weight", "bias")}


@pytest.mark.timeout(700)  # above train_launch's own MPI timeout (630 s here)
def test_adam_precondition_trains_like_uncompressed(uncompressed):
    """precondition='adam' (SGD inner optimizer): bit-identical ranks (train_digits), the
    uncompressed accuracy within the same tolerance, every tensor's (t, m, v) in the state beside
    Marsit's memory, and the 10 dense warm-up steps of 220 leaving a large saving."""
    res = train_digits("marsit-adam", launched_with=TRAINED)
    r = res[0]
    print(f"uncompressed acc {uncompressed['acc']:.4f}; marsit-adam acc {r['acc']:.4f} loss "
          f"{r['loss']:.4f}, {r['stats']['ratio']:.1f}x fewer bytes")
    assert r["acc"] >= uncompressed["acc"] - TOLERANCE_ACC
    assert r["loss"] <= uncompressed["loss"] + TOLERANCE_LOSS
    assert r["memory_keys"] == sorted(
        [f"{layer}.weight" for layer in (0, 2, 4)]
        + [f"{layer}.{p}#adam" for layer in (0, 2, 4) for p in ("weight", "bias")])
    assert 8 < r["stats"]["ratio"] < 20  # all dense for 10 steps, then ~1 bit per element
