"""Rank script: checkpoint at step N and resume gives bit-identical parameters at step N+M,
compared with the uninterrupted run, for a named compressor (torch_common.compression_for).
Covers both state forms: per-rank ``state_dict()`` and the gathered
``state_dict(all_ranks=True)`` that rank 0 saves alone (broadcast here as if loaded from rank 0's
file); losing the compressor state must change the trajectory. Args: one or more cases of four
each, ``compression form lr momentum`` (form 'rank' or 'gathered'), run one after the other in
this launch; each reports its fields with ``case='<compression>-<form>'``."""
import copy
import io
import sys

import torch
import horovod.torch as hvd

from report import cases, report
from torch_common import build, compression_for, digest, load_digits_split, train

N, M = 6, 6


def resume_case(name, form, lr, momentum, xtr, ytr):
    """The fields one case reports (see the module docstring)."""
    comp = compression_for(name)
    model, opt = build(comp, lr, momentum, hidden=64)
    identical = train(model, opt, xtr, ytr, 0, N)
    comp_state = comp.state_dict(all_ranks=(form == "gathered"))
    if form == "gathered":
        comp_state = hvd.broadcast_object(comp_state if hvd.rank() == 0 else None, root_rank=0,
                                          name="comp_state")
    buf = io.BytesIO()  # through torch.save/torch.load, as a user's checkpoint file would go
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "comp": comp_state}, buf)
    identical += train(model, opt, xtr, ytr, N, N + M)
    uninterrupted = digest(model)
    memory = comp.state_dict()["state"]
    norm = float(sum(float(sum(abs(torch.as_tensor(a)).sum()
                               for a in (v if isinstance(v, tuple) else (v,))))
                     for v in memory.values()))

    buf.seek(0)
    state = torch.load(buf, weights_only=False)
    comp2 = compression_for(name)
    model2, opt2 = build(comp2, lr, momentum, hidden=64, state=copy.deepcopy(state))
    train(model2, opt2, xtr, ytr, N, N + M, check=False)

    state["comp"] = compression_for(name).state_dict()  # a fresh compressor: state lost
    comp3 = compression_for(name)
    model3, opt3 = build(comp3, lr, momentum, hidden=64, state=state)
    train(model3, opt3, xtr, ytr, N, N + M, check=False)
    return dict(identical_steps=identical, same=digest(model2) == uninterrupted,
                fresh_differs=digest(model3) != uninterrupted, memory_keys=sorted(memory),
                memory_norm=norm, step=comp2.state_dict()["step"])


hvd.init()
(x, y), _ = load_digits_split(0)
for name, form, lr, momentum in cases(sys.argv[1:], 4):
    report(case=f"{name}-{form}", rank=hvd.rank(),
           **resume_case(name, form, float(lr), float(momentum), x, y))
