"""Tensor naming (hvdcomp.facade.frontends.naming and the adapters' ``callers()`` tables): the lookup
as pure functions, then on real ranks with Horovod's own wrappers (rank scripts
tests/mpi/naming_torch.py and naming_tf.py): state keys equal the parameter / variable names on
every Horovod path (default, num_groups, groups), named direct calls keep separate state, and
unnamed ones raise UnnamedTensorError on every rank."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import hvdcomp
from hvdcomp.facade.frontends import Identity, naming
from hvdcomp.facade.frontends import torch as torch_adapter
from hvdcomp.facade.frontends.numpy import named
from mpirun import results, run


def test_position_hands_out_repeated_objects_in_order_per_sequence():
    a, b = object(), object()
    seq, other = [a, b, a], [a, a]
    assert naming.position(seq, b) == 1 and naming.position(seq, object()) is None
    assert naming.position(seq, a) == 0
    assert naming.position(other, a) == 0  # another sequence in between does not reset seq
    assert naming.position(seq, a) == 2
    assert naming.position(seq, a) == 0  # every position served: the sequence is reduced again
    assert naming.group_member("grp", 1, 3) == "grp_2of3"  # Horovod's own member names


def grouped_call(tensors, name, inline):
    """Stands for a Horovod function that compresses a list: ``inline`` mimics Python 3.12
    (PEP 709: no comprehension frame), else a comprehension with its own frame (<= 3.11)."""
    here = naming.Caller("grouped_call", "tensors, name", naming.code_of(grouped_call),
                         lambda f, t: Identity(naming.group_member(
                             f.f_locals["name"], naming.position(f.f_locals["tensors"], t),
                             len(f.f_locals["tensors"]))))

    def compress(t):  # the compressor's frame, below the Horovod function
        return naming.find(t, (here,), __import__("sys")._getframe(1), 4)

    if inline:
        out = []
        for t in tensors:
            out.append(compress(t))
        return out
    return [compress(t) for t in tensors]


def test_the_lookup_needs_no_comprehension_frame():
    ts = [torch.ones(2), torch.zeros(3)]
    names = [["g_1of2", "g_2of2"]] * 2
    assert [[i.name for i in grouped_call(ts, "g", inline)] for inline in (False, True)] == names


def test_torch_table_matches_horovod_functions():
    from horovod.torch import mpi_ops
    from horovod.torch.optimizer import _DistributedAdasumOptimizer, _DistributedOptimizer
    functions = [mpi_ops.allreduce, mpi_ops.grouped_allreduce,
                 _DistributedOptimizer._allreduce_grad_async,
                 _DistributedOptimizer._grouped_allreduce_grad_async,
                 _DistributedAdasumOptimizer._allreduce_grad_async]
    rows = torch_adapter.callers()
    for fn in functions:
        frame = SimpleNamespace(f_code=fn.__code__)
        assert [row.matches(frame) for row in rows].count(True) == 1, fn
    assert not any(row.matches(SimpleNamespace(f_code=mpi_ops.allreduce_async.__code__))
                   for row in rows)


def test_torch_grouped_optimizer_row_reads_the_group():
    """The group path reads the optimizer's _parameter_names and the group's list ``ps``: the
    tensor is the .grad of one of them (no comprehension-local ``p`` needed)."""
    p1, p2 = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    p1.grad, p2.grad = torch.zeros(2), torch.zeros(3)
    opt = SimpleNamespace(_parameter_names={p1: "a", p2: "b"}, process_set="set")
    row = torch_adapter.callers()[1]
    frame = SimpleNamespace(f_locals={"self": opt, "ps": (p1, p2)})
    identity = row.read(frame, p2.grad)
    assert identity == Identity("b", p2, "set", opt)
    assert row.read(frame, torch.zeros(3)) is None  # not this group's tensor


def test_unnamed_torch_and_numpy_tensors_are_refused():
    with pytest.raises(hvdcomp.UnnamedTensorError) as err:
        hvdcomp.TopK().compress(torch.ones(5, 3, dtype=torch.float64))
    msg = str(err.value)
    assert msg.startswith("TopK: cannot name a tensor of shape [5, 3] and dtype float64")
    assert "Pass name= to hvd.allreduce" in msg
    with pytest.raises(hvdcomp.UnnamedTensorError, match=r"Marsit: .*shape \[7\].*named\("):
        hvdcomp.Marsit().compress(np.ones(7, np.float32))


def test_numpy_arrays_are_named_explicitly():
    a = named(np.arange(4, dtype=np.float32), "w")
    assert a.hvdcomp_name == "w" and a.reshape(2, 2).hvdcomp_name == "w"
    assert type(np.asarray(a)) is np.ndarray  # the adapters' working arrays are plain
    with pytest.raises(ValueError):
        named(a, "")


def test_tensorflow_gradient_row_names_variables():
    pytest.importorskip("horovod.tensorflow")
    from hvdcomp.facade.frontends import tensorflow as tf_adapter
    g1, g2 = object(), object()
    vars_ = [SimpleNamespace(name="kernel:0"), SimpleNamespace(name="kernel:0"),
             SimpleNamespace(name="u:0"), SimpleNamespace(name="v:0")]
    frame = SimpleNamespace(f_locals={"grads": [g1, object(), g2, g2], "vars": vars_,
                                      "process_set": "set"}, f_back=None)
    row = tf_adapter.callers()[2]
    call = tf_adapter.GradientsCall(frame.f_locals["grads"], vars_)  # the step's batch
    assert row.read(frame, g1) == Identity("kernel:0#0", vars_[0], "set", None, call)
    assert [row.read(frame, g2).name for _ in range(2)] == ["u:0", "v:0"]  # one tensor, two
    import horovod.tensorflow as hvd  # AutoGraph's conversion keeps the module and 'tf__'
    assert row.matches(SimpleNamespace(f_globals=hvd.__dict__,
                                       f_code=SimpleNamespace(co_name="tf__allreduce_grads")))


@pytest.mark.timeout(240)
def test_torch_optimizer_paths_and_direct_calls_on_real_ranks():
    res = results(run(2, "naming_torch.py", "paths", timeout=200))
    assert sorted(res) == [0, 1]
    for rank, r in res.items():
        for mode in ("default", "num_groups", "groups"):
            m = r[mode]
            assert m["keys"] == m["names"] and len(m["names"]) == 6, (mode, m)
            assert m["identities"] == 18 and m["owners_right"] and m["identical"], (mode, m)
        # grouping changes nothing in the math: the same weights on every path
        assert r["default"]["digest"] == r["num_groups"]["digest"] == r["groups"]["digest"]
        for method in ("TopK", "Marsit"):  # separate state: zeros in, exactly zeros out
            m = r[method]
            assert m["first_nonzero"] > 0 and m["zeros_max"] == 0.0, (method, m)
            assert m["keys"] == ["direct.a", "direct.zeros"]
        assert r["grouped_keys"] == ["grp_1of2", "grp_2of2"]
        assert r["direct_process_sets"] == [True, True]
        for key, method in (("unnamed", "Marsit"), ("unnamed_grouped", "TopK")):
            assert r[key] and r[key].startswith(
                f"UnnamedTensorError: {method}: cannot name a tensor of shape [4096] and dtype "
                f"float32 on rank {rank} of 2."), r[key]
            assert "Pass name= to hvd.allreduce" in r[key]


@pytest.mark.timeout(150)
def test_unnamed_torch_allreduce_ends_the_job_with_the_error_from_every_rank():
    """Uncaught: every rank prints the error and the job ends non-zero (the abort hook is off
    so that no rank is killed before it prints; with it, the first rank aborts the job)."""
    proc = run(2, "naming_torch.py", "uncaught", timeout=120, expect_ok=False,
               env={"HVDCOMP_ABORT_ON_EXCEPTION": "0"})
    assert proc.returncode != 0
    for rank in (0, 1):  # each rank's own output: in proc.stdout their lines interleave
        assert (f"UnnamedTensorError: Marsit: cannot name a tensor of shape [3000] and dtype "
                f"float32 on rank {rank} of 2.") in proc.rank_output[rank], proc.stdout[-3000:]


@pytest.mark.timeout(300)
def test_tensorflow_paths_and_direct_calls_on_real_ranks():
    res = results(run(2, "naming_tf.py", timeout=240))
    assert sorted(res) == [0, 1]
    for rank, r in res.items():
        for mode in ("default", "num_groups", "groups"):
            m = r[mode]
            assert m["keys"] == m["names"] and {"u:0", "v:0"} <= set(m["keys"]), (mode, m)
            assert m["identities"] == 12 and m["owners_right"] and m["identical"], (mode, m)
        k = r["keras"]
        assert k["keys"] == k["names"] and len(k["names"]) == 4 and k["optimizer_right"]
        assert k["identical"]
        d = r["direct"]
        assert d["first_nonzero"] > 0 and d["zeros_max"] == 0.0
        assert d["keys"] == ["direct.a", "direct.zeros", "grp_1of2", "grp_2of2", "keras.g"]
        for key in ("unnamed_eager", "unnamed_function"):  # eager, and inside tf.function
            assert r[key] and r[key].startswith("UnnamedTensorError: ") and (
                f"Marsit: cannot name a tensor of shape [4096] and dtype float32 on rank {rank} "
                "of 2.") in r[key], r[key]
