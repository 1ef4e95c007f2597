"""A steady training step allocates no full-size host array (issue #18): through the stock
hvd.DistributedOptimizer on 2 real ranks, each method writes the step into the user's gradient
(as Horovod's own in-place allreduce does; BinSGDM stepping aside hands back a view of its
message, in a buffer reused across steps) and keeps its state and work buffers across steps,
preconditioners included; what a step still allocates is message-sized (packed bits, index
lists, vote totals). A direct ``hvd.allreduce`` stays out of place."""
import pytest

from mpirun import results, run, shared

# (names, warm-up steps before the measured ones: past precondition='adam' and its dense warm-up)
# SketchFusion: its default since issue 30 (5% of the elements) sends a sketch of 0.35 of the
# gradient, whose message-sized arrays alone measure 0.83, so it has its own limit (a full-size
# array on top would pass 1.8); at 1% (the earlier default) the general limit holds.
CASES = {"methods": (["none", "marsit", "marsit-auto", "efsignsgd", "topk", "sketchfusion-bare",
                      "sketchfusion-1pct", "binsgdm"], 3),
         "preconditioned": (["marsit-rms", "marsit-adam", "topk-adam"], 12),
         # BinSGDM stepping aside: its message, summed by Horovod in place and handed back as
         # p.grad, is written into a buffer kept across steps (StateStore.outgoing), not a new
         # one per step (the peak would not show it: zero_grad frees the last one first)
         "aside": (["binsgdm-aside"], 3)}
# where the result is a view of the method's message (a new storage for p.grad), not in place
NOT_IN_PLACE = {"binsgdm-aside"}
# in units of the gradient's bytes: one full-size float32 array alone is 1.0; the largest
# message-sized arrays left are BinSGDM's int8 vote totals (0.25)
LIMIT = 0.5
LIMITS = {"sketchfusion-bare": 1.0}


@shared
def allocation_launch(warm):
    """One launch of tests/mpi/steady_allocation.py on 2 ranks for every case of ``warm``."""
    names = [n for case_names, w in CASES.values() if w == warm for n in case_names]
    return run(2, "steady_allocation.py", *names, "--warm", warm, timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_steady_step_allocates_no_full_size_array(case):
    names, warm = CASES[case]
    by_rank = results(allocation_launch(warm))
    assert sorted(by_rank) == [0, 1]
    for name in names:
        rows = [by_rank[r]["methods"][name] for r in (0, 1)]
        assert rows[0]["digest"] == rows[1]["digest"], name  # bit-identical ranks
        for rank, row in enumerate(rows):
            assert row["peak"] < LIMITS.get(name, LIMIT), (name, rank, row)
            if name in NOT_IN_PLACE:
                assert row["reused"], (name, rank, row)
            else:
                assert row["in_place"], (name, rank, row)
            assert row["direct_out_of_place"], (name, rank, row)
