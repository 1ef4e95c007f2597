"""Rank script: bad input gives a clear error on every rank, never a hang or silent corruption.
- NaN in one rank's gradient: NonFiniteGradientError on every rank naming the tensor and rank,
  compensation memory unchanged; with on_nonfinite='skip' the step is skipped on all ranks.
- shapes that differ between ranks: RankMismatchError naming the tensor and both shapes.
- an integer tensor: UnsupportedTensorError naming it.
"""
import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import batch, identical_across_ranks, load_digits_split, make_model

hvd.init()
torch.manual_seed(0)
(xtr, ytr), _ = load_digits_split(0)
rank, out = hvd.rank(), {}


def run_steps(model, opt, steps, nan_at=None, nan_rank=1):
    for step in range(steps):
        xb, yb = batch(xtr, ytr, step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        if step == nan_at and rank == nan_rank:
            loss = loss * float("nan")
        loss.backward()
        opt.step()


# NaN, on_nonfinite="raise": error everywhere, memory untouched.
model = make_model(hidden=64)
comp = hvdcomp.Marsit(on_nonfinite="raise")
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(), compression=comp)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
run_steps(model, opt, 2)
before = comp.state_dict()
try:
    run_steps(model, opt, 3, nan_at=0)
    out["nan_error"] = None
except hvdcomp.NonFiniteGradientError as exc:
    out["nan_error"] = str(exc)
after = comp.state_dict()
out["memory_unchanged"] = all(np.array_equal(before["state"][k], after["state"][k])
                              for k in before["state"]) and before["step"] == after["step"]

# NaN, opt-in skip: the step is skipped (zero gradients) on every rank, nothing diverges.
model = make_model(hidden=64)
comp = hvdcomp.Marsit(on_nonfinite="skip")
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(), compression=comp)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
run_steps(model, opt, 2)
w_before = [p.detach().clone() for p in model.parameters()]
run_steps(model, opt, 1, nan_at=0)
out["skip_unchanged"] = all(torch.equal(a, b) for a, b in zip(w_before, model.parameters()))
out["skip_identical"] = identical_across_ranks(model)
out["skipped"] = comp.state_dict()["skipped"]
run_steps(model, opt, 2)
out["skip_then_trains"] = all(torch.isfinite(p).all().item() for p in model.parameters())

# Shapes that differ between ranks under one name.
try:
    hvd.allreduce(torch.ones(2000 + 100 * rank), name="mismatched", compression=hvdcomp.Marsit())
    out["shape_error"] = None
except hvdcomp.RankMismatchError as exc:
    out["shape_error"] = str(exc)

# An integer tensor.
try:
    hvd.allreduce(torch.ones(3000, dtype=torch.int32), name="ints", compression=hvdcomp.Marsit())
    out["dtype_error"] = None
except hvdcomp.UnsupportedTensorError as exc:
    out["dtype_error"] = str(exc)

# Low precision: fp16 and bf16 gradients are handled (computed in float32, returned as given).
for dt in (torch.float16, torch.bfloat16):
    t = torch.randn(5000, generator=torch.Generator().manual_seed(rank)).to(dt)
    r = hvd.allreduce(t, name=f"lowp.{dt}", compression=hvdcomp.Marsit())
    out[f"lowp_{str(dt)[6:]}"] = [str(r.dtype), bool(torch.isfinite(r.float()).all()),
                                  r.shape == t.shape]
# Empty and 0-d tensors: reduced like any other (uncompressed path), shape kept.
e = hvd.allreduce(torch.zeros(0), name="empty", compression=hvdcomp.Marsit())
z = hvd.allreduce(torch.tensor(float(rank)), name="scalar", compression=hvdcomp.Marsit())
out["empty"] = [list(e.shape), e.numel()]
out["scalar"] = [list(z.shape), float(z)]
report(rank=rank, **out)
