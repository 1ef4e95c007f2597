"""LayerFusion in training (``fusion='auto'``, hvdcomp.bucketing) on real MPI ranks through the
stock horovod.torch DistributedOptimizer, plus unit tests of the scheduler's pure helpers."""
import pytest

import hvdcomp
from hvdcomp import bucketing
from mpirun import results, run, shared

from conftest import SETTINGS
from test_training import EPOCHS, TOLERANCE_ACC, TOLERANCE_LOSS, resume_launch


# -- pure helpers ---------------------------------------------------------------------------
def test_agree_takes_rank0_order_median_ready_and_slowest_reduction():
    rows = [(["b", "a", "c"], [10.0, 10.5, 11.0], [(1, 100, 0.2), (2, 50, 0.1)]),
            (["a", "b", "c"], [5.0, 5.1, 6.0], [(1, 100, 0.3), (2, 50, 0.05)]),
            (["b", "a", "c"], [0.0, 0.7, 1.2], [(1, 100, 0.1), (2, 50, 0.4)])]
    order, backward, samples = bucketing.agree(rows)
    assert order == ["b", "a", "c"]
    # ready times relative to each rank's first arrival: b (0, 0.1, 0), a (0.5, 0, 0.7),
    # c (1, 1, 1.2); medians 0, 0.5, 1 -> backward times 0, 0.5, 0.5
    assert backward == pytest.approx([0.0, 0.5, 0.5])
    assert samples == [(100, 0.3), (50, 0.4)]



def test_make_plan_rules():
    order, sizes = ["l2", "l1", "l0"], [8 << 20, 4, 4]
    fb = bucketing.make_plan(order, sizes, None, [], "fallback")
    assert fb.rule == "fallback" and fb.buckets == [["l2"], ["l1", "l0"]]  # 4 MB size rule
    probe = bucketing.make_plan(order, sizes, None, [], "probe")
    assert probe.buckets == [["l2"], ["l1"], ["l0"]] and probe.bytes == sizes
    # a costly message and slow backward between layers: fuse the two small late layers only
    dp = bucketing.make_plan(order, sizes, [0.0, 1.0, 0.0], [], "dp", cost=(0.5, 1e9))
    assert dp.rule == "dp" and dp.buckets == [["l2"], ["l1", "l0"]]
    assert dp.latency == 0.5 and dp.estimate == pytest.approx(1.0 + 0.5 + 8 / 1e9)
    # fitted from (bytes, seconds) samples: latency 1 ms, 1 GB/s
    fit = bucketing.make_plan(order, sizes, [0.0, 0.0, 0.0], [(0, 1e-3), (1e6, 2e-3)], "dp")
    assert fit.latency == pytest.approx(1e-3) and fit.bandwidth == pytest.approx(1e9)
    assert fit.buckets == [["l2", "l1", "l0"]]  # nothing to overlap with: one message
    again = bucketing.FusionPlan.from_dict(fit.as_dict())
    assert again.as_dict() == fit.as_dict() and "1 buckets" in again.describe()


def test_fusion_arguments_are_checked():
    with pytest.raises(ValueError, match="fusion must be one of"):
        hvdcomp.Marsit(fusion="bucket")
    with pytest.raises(ValueError, match="fusion_cost applies"):
        hvdcomp.TopK(fusion="step", fusion_cost=(1e-3, 1e9))
    with pytest.raises(ValueError, match="fusion_cost must be"):
        hvdcomp.SketchFusion(fusion="auto", fusion_cost=(1e-3, 0))
    assert hvdcomp.BinSGDM(fusion="auto").describe_fusion().endswith("no plan yet (first step: one batch)")


# -- real ranks -----------------------------------------------------------------------------
AUTO = ["marsit-auto", "topk-auto"]


def _base(name):
    return name.replace("-auto", "") + ("-bare" if "topk" in name else "")


@shared
def auto_fusion_launch():
    """One launch of tests/mpi/fusion_train.py on 4 ranks for every name of ``AUTO``, at its
    base's rates and epochs: as tests/test_training.py trains it (TopK's default is at
    0.906-0.97 after 20 epochs (rounding, and here the plan's buckets, decide), within the
    tolerance after 30)."""
    args = [a for name in AUTO
            for a in (name, EPOCHS.get(_base(name), 20), *SETTINGS[_base(name)])]
    return run(4, "fusion_train.py", *args, timeout=600)


@pytest.mark.timeout(700)
@pytest.mark.parametrize("name", AUTO)
def test_auto_fusion_trains_like_uncompressed_with_one_plan(uncompressed, name):
    epochs = EPOCHS.get(_base(name), 20)
    res = results(auto_fusion_launch(), case=name)
    assert sorted(res) == [0, 1, 2, 3]
    for r in res.values():
        assert r["identical_steps"] == r["steps"] == 11 * epochs and r["step"] == 11 * epochs
        assert [p["rule"] for p in r["plans"]] == ["fallback", "probe", "dp", "dp"]
        assert r["memory_keys"] == ["0.weight", "2.weight", "4.weight"]
    first = res[0]
    assert all(r["plans"] == first["plans"] and r["plan"] == first["plan"] for r in res.values())
    names = sorted(n for b in first["plan"]["buckets"] for n in b)
    assert names == ["0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight"]
    assert first["plan"]["latency"] > 0 and first["plan"]["estimate"] > 0
    assert first["describe"].startswith(f"{'Marsit' if 'marsit' in name else 'TopK'}: LayerFusion plan 'dp'")
    assert len({(r["acc"], r["loss"]) for r in res.values()}) == 1
    print(f"{name}: {first['describe']}; acc {first['acc']:.4f} loss {first['loss']:.4f} "
          f"(uncompressed {uncompressed['acc']:.4f} / {uncompressed['loss']:.4f})")
    assert first["acc"] >= uncompressed["acc"] - TOLERANCE_ACC
    assert first["loss"] <= uncompressed["loss"] + TOLERANCE_LOSS


@pytest.mark.timeout(200)
def test_nan_in_a_late_bucket_raises_everywhere_and_rolls_back():
    res = results(run(4, "fusion_errors.py", timeout=180))
    assert sorted(res) == [0, 1, 2, 3]
    for r in res.values():
        assert len(r["buckets"]) == 6 and r["buckets"][-1] == ["0.weight"]
        assert "'0.weight' on rank 1" in r["nan_error"]
        assert r["buckets_reduced_before_nan"] == 5  # the worker had reduced the first five
        assert r["state_unchanged"]
        assert r["skip_buckets_reduced"] == 5 and r["skipped"] == 1
        assert r["skip_params_unchanged"] and r["skip_memory_unchanged"]
        assert r["skip_then_identical_steps"] == 4 and r["skip_then_finite"]
        assert r["worker_error"] == "injected failure in the 2.weight bucket"
        assert r["worker_error_thread"] == ["hvdcomp-fusion"]
        assert r["worker_error_state_unchanged"]


RESUME = (("marsit-auto", "rank"), ("topk-auto", "rank"))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", [name for name, _ in RESUME])
def test_resume_with_fusion_is_bit_identical(name):
    res = results(resume_launch(RESUME), case=f"{name}-rank")
    assert sorted(res) == [0, 1, 2]
    for r in res.values():
        assert r["identical_steps"] == 12 and r["step"] == 12
        assert r["same"], "resumed run diverged from the uninterrupted one"
        assert r["fresh_differs"]
