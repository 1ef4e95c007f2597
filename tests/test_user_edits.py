"""What a Horovod/PyTorch user does besides the optimizer's plain step, which must never go
silently wrong (issue 82), on 2 real MPI ranks, each case against Horovod's own
``hvd.Compression.none`` on the same script: gradient clipping between ``synchronize()`` and
``step()`` under the user's AdamW, a resume from the model's and optimizer's own state dicts,
and a direct ``hvd.allreduce`` of a value the user reads. Rank script: tests/mpi/user_edits.py."""
import pytest

from mpirun import results, run, shared

# the methods that send the user's Adam momentum (FollowAdam), and BinSGDM (its result is the
# step itself, ThroughAdam)
METHODS = ["marsit", "topk", "sketchfusion-bare", "efsignsgd", "binsgdm"]


def case(*args, timeout=240):
    res = results(run(2, "user_edits.py", *args, timeout=timeout))
    assert sorted(res) == [0, 1]
    return res


@pytest.fixture(scope="module", params=["norm", "value"])
def clipped(request):
    return request.param, case("clip", request.param, "none", *METHODS, timeout=280)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", METHODS)
def test_clipping_between_synchronize_and_step_trains_as_uncompressed_under_adamw(clipped, name):
    """Horovod's clipping recipe (synchronize, clip_grad_norm_ / clip_grad_value_, step inside
    skip_synchronize) with the user's AdamW: the clip changes the gradients in most steps, every
    update stays within the bound of the methods' unclipped updates (under 12 lr: the methods
    that send Adam's momentum move by up to ~10 lr where that momentum starts, clipped or not;
    none by ~1.5 lr) and training ends near uncompressed training. Before, AdamW's first moment
    was the unclipped momentum while its second moment saw the clipped gradient: steps of
    20-1e30 lr, clipping by norm ended in NaN or losses 80 times none's."""
    kind, res = clipped
    none, got = res["none"], res[name]
    assert none["clipped_steps"] >= 60 and got["clipped_steps"] >= 60, (kind, none, got)
    assert none["largest_step_over_lr"] < 2, none
    assert got["largest_step_over_lr"] < 12, (kind, name, got)
    assert got["loss"] < 2.5 * none["loss"], (kind, name, got["loss"], none["loss"])
    assert got["identical"]


RESUMED = ["marsit", "binsgdm", "none"]


@shared
def resumed():
    return case("resume", *RESUMED, timeout=200)


@pytest.mark.timeout(250)
@pytest.mark.parametrize("name", RESUMED)
def test_a_resume_from_the_users_own_checkpoint_warns_on_every_rank_what_was_lost(name):
    """The model's and optimizer's state dicts saved at step 10 and loaded by a new model,
    optimizer and compressor: Horovod's none resumes bit for bit and says nothing; a method,
    whose error memory or momentum is in neither dict, warns once on every rank, naming what was
    lost and the lines to add. Before: a silently different trajectory."""
    for rank, res in resumed().items():
        r = res[name]
        assert r["identical"]
        if name == "none":
            assert r["equal"] and r["warnings"] == []
            continue
        assert not r["equal"]
        assert len(r["warnings"]) == 1, r["warnings"]
        assert "resumes after 10 step(s)" in r["warnings"][0]
        assert "compression.load_state_dict" in r["warnings"][0]
        assert f"raised on rank {rank}" in r["warnings"][0]


DIRECT = ["marsit", "topk"]


@shared
def direct():
    return case("direct", *[a for name in DIRECT for a in (name, "shared", name, "own")],
                timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", DIRECT)
def test_a_direct_allreduce_of_a_value_the_user_reads_is_exact_or_warned_about(name):
    """hvd.allreduce(value, name='metric', compression=...) after training, 30 times: with the
    optimizer's compressor, a name first seen after its gradients is summed exactly (before:
    100% error on the first call, 260% on average for Marsit); with a compressor of its own,
    the first call warns once that direct calls are compressed as gradients."""
    for res in direct().values():
        shared_, own = res[f"{name}-shared"], res[f"{name}-own"]
        assert max(shared_["errors"]) < 1e-6 and shared_["warnings"] == []
        assert min(own["errors"]) > 0.1  # compressed, as the user asked
        assert len(own["warnings"]) == 1
        assert "compression=hvd.Compression.none" in own["warnings"][0]
