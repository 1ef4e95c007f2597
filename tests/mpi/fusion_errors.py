"""Rank script: whole-step semantics with LayerFusion buckets (``fusion='layerwise'``: one bucket
per tensor after the first step, so the bucket holding the NaN is the last of six and the
worker thread has already reduced, and changed the state of, the buckets before it).
- on_nonfinite='raise' (Marsit): NonFiniteGradientError from opt.step() on every rank, naming
  the tensor and rank; memory and step count as before the step.
- on_nonfinite='skip' (TopK): the whole step returns zeros on every rank (parameters unchanged
  with plain SGD), memory unchanged, and training goes on bit-identical.
- an exception raised in the worker thread surfaces from opt.step(), state rolled back.
"""
import threading

import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, identical_across_ranks, load_digits_split, make_model

hvd.init()
(xtr, ytr), _ = load_digits_split(0)
rank, out = hvd.rank(), {}


def build(comp):
    torch.manual_seed(0)
    model = make_model(hidden=64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, opt


def run_steps(model, opt, start, stop, nan_at=None, nan_rank=1):
    for step in range(start, stop):
        xb, yb = batch(xtr, ytr, step, rank)
        opt.zero_grad()
        hook = None
        if step == nan_at and rank == nan_rank:  # NaN in the first layer only: the last bucket
            hook = model[0].weight.register_hook(lambda g: g * float("nan"))
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        if hook is not None:
            hook.remove()
        opt.step()


def same_state(a, b):
    return (a["step"] == b["step"] and sorted(a["state"]) == sorted(b["state"])
            and all(np.array_equal(a["state"][k], b["state"][k]) for k in a["state"]))


comp = hvdcomp.Marsit(fusion="layerwise", on_nonfinite="raise")
model, opt = build(comp)
run_steps(model, opt, 0, 3)
before, reductions = comp.state_dict(), comp.driver.count
out["buckets"] = comp.fusion_plan["buckets"]
try:
    run_steps(model, opt, 3, 4, nan_at=3)
    out["nan_error"] = None
except hvdcomp.NonFiniteGradientError as exc:
    out["nan_error"] = str(exc)
out["buckets_reduced_before_nan"] = comp.driver.count - reductions
out["state_unchanged"] = same_state(before, comp.state_dict())

comp = hvdcomp.TopK(fusion="layerwise", on_nonfinite="skip", seed=3)
model, opt = build(comp)
run_steps(model, opt, 0, 3)
before, reductions = comp.state_dict(), comp.driver.count
w_before = [p.detach().clone() for p in model.parameters()]
run_steps(model, opt, 3, 4, nan_at=3)
out["skip_buckets_reduced"] = comp.driver.count - reductions
out["skip_params_unchanged"] = all(torch.equal(a, b) for a, b in zip(w_before, model.parameters()))
after = comp.state_dict()
out["skip_memory_unchanged"] = same_state(dict(before, step=before["step"] + 1), after)
out["skipped"] = after["skipped"]
ok = 0
for step in range(4, 8):
    run_steps(model, opt, step, step + 1)
    ok += identical_across_ranks(model)
out["skip_then_identical_steps"] = ok
out["skip_then_finite"] = all(torch.isfinite(p).all().item() for p in model.parameters())
# An exception inside the worker thread (here: injected into Marsit's reduction of the
# '2.weight' bucket, on every rank) surfaces from opt.step() in the main thread, state rolled back.
comp = hvdcomp.Marsit(fusion="layerwise")
model, opt = build(comp)
run_steps(model, opt, 0, 3)
method = comp.runtimes.current().algorithm  # the copy of the method the runtime runs
before, reduce_bucket, threads = comp.state_dict(), method.reduce, []


def failing(batch, scalars):
    if any(e.key == "2.weight" for e in batch.entries):
        threads.append(threading.current_thread().name)
        raise RuntimeError("injected failure in the 2.weight bucket")
    return reduce_bucket(batch, scalars)


method.reduce = failing  # the method's reduction (hvdcomp.methods.contract)
try:
    run_steps(model, opt, 3, 4)
    out["worker_error"] = None
except RuntimeError as exc:
    out["worker_error"] = str(exc)
out["worker_error_thread"] = threads
out["worker_error_state_unchanged"] = same_state(before, comp.state_dict())
report(rank=rank, **out)
