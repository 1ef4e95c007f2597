"""Rank script: what a user does with Horovod besides the optimizer's plain step, one case per
run (``argv[1]``; ``argv[2:]``: the case's arguments), each reporting what every rank saw.

- clip KIND NAME...: the user's AdamW (lr 3e-3, weight decay 0.01) on a digits MLP
  (64-256-256-10), 100 steps, Horovod's clipping recipe: ``synchronize()``, then
  ``clip_grad_norm_(..., 0.05)`` (KIND 'norm') or ``clip_grad_value_(..., 0.002)`` ('value';
  'off': no clip), then ``step()`` inside
  ``skip_synchronize()``; per compression (test names, or 'none'): the held-out loss, the largest
  step of any weight divided by lr (weight decay taken out), how many steps the clip changed the
  gradients, and whether every rank holds the same weights.
- resume NAME...: per compression, the checkpoint a Horovod user already writes (``model.state_dict()`` and
  ``optimizer.state_dict()``), saved at step 10 of 20 and loaded by a new model and optimizer
  with a new compressor: what the first steps after the resume warn, and how far the resumed run
  ends from the uninterrupted one.
- direct (NAME WHOSE)...: ``hvd.allreduce(t, name=..., compression=...)`` outside the optimizer, after
  12 training steps, 30 times with new values (a metric), with the optimizer's compressor
  ('shared') or one of its own ('own'): each result's error against the exact mean, and what
  was warned.
"""
import copy
import sys
import warnings

import torch
import horovod.torch as hvd

from report import report
from torch_common import (batch_loss, compression_for, flat, identical_across_ranks,
                          load_digits_split)

CASE, ARGS = sys.argv[1], sys.argv[2:]
torch.set_num_threads(1)
hvd.init()
rank, out = hvd.rank(), {}
(xtr, ytr), (xte, yte) = load_digits_split(0)
LR, WD = 3e-3, 0.01
HIDDEN = 256


def build(name, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, 10))
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD),
                                   named_parameters=model.named_parameters(),
                                   compression=compression_for(name))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, opt


def loss_of(model, step):
    return batch_loss(model, xtr, ytr, step, rank)


def held_out_loss(model):
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(xte), yte))


# -- clip ----------------------------------------------------------------------------------------
def clip_run(name, kind, steps=100):
    model, opt = build(name)
    params = list(model.parameters())
    largest, bit = 0.0, 0
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.synchronize()
        before = [p.grad.detach().clone() for p in params]
        if kind == "norm":
            torch.nn.utils.clip_grad_norm_(params, 0.05)
        elif kind == "value":
            torch.nn.utils.clip_grad_value_(params, 0.002)
        bit += any(not torch.equal(b, p.grad) for b, p in zip(before, params))
        weights = [p.detach().clone() for p in params]
        with opt.skip_synchronize():
            opt.step()
        moved = max(float((w * (1 - LR * WD) - p.detach()).abs().max()) / LR
                    for w, p in zip(weights, params))
        largest = max(largest, moved)
    return {"loss": held_out_loss(model), "largest_step_over_lr": largest, "clipped_steps": bit,
            "identical": identical_across_ranks(model)}


def case_clip():
    kind, names = ARGS[0], ARGS[1:]
    for name in names:
        out[name] = clip_run(name, kind)


# -- resume --------------------------------------------------------------------------------------
def train(model, opt, start, stop):
    for step in range(start, stop):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()


def case_resume():
    for name in ARGS:
        out[name] = resume_run(name)


def resume_run(name):
    model, opt = build(name)
    train(model, opt, 0, 10)
    saved = {"model": copy.deepcopy(model.state_dict()),
             "opt": copy.deepcopy(opt.state_dict())}
    train(model, opt, 10, 20)
    model2, opt2 = build(name, seed=1)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model2, opt2, 10, 20)
    return {"warnings": [str(w.message) for w in caught if "hvdcomp" in str(w.message)],
            "equal": bool(torch.equal(flat(model), flat(model2))),
            "identical": identical_across_ranks(model2)}


# -- direct --------------------------------------------------------------------------------------
def case_direct():
    """``ARGS``: pairs of a compression and 'shared' (the optimizer's compressor, after
    training) or 'own' (a compressor of its own, used for nothing else)."""
    for name, whose in zip(ARGS[::2], ARGS[1::2]):
        out[f"{name}-{whose}"] = direct_run(name, whose)


def direct_run(name, whose):
    model, opt = build(name)
    train(model, opt, 0, 12)
    compression = opt._compression if whose == "shared" else compression_for(name)
    errors = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(30):
            torch.manual_seed(100 + call * 7 + rank)
            value = torch.randn(5000)
            exact = hvd.allreduce(value, name="metric.exact", compression=hvd.Compression.none)
            got = hvd.allreduce(value, name="metric", compression=compression)
            errors.append(float((got - exact).norm() / exact.norm()))
    return {"errors": errors,
            "warnings": [str(w.message) for w in caught if "hvdcomp" in str(w.message)]}


{"clip": case_clip, "resume": case_resume, "direct": case_direct}[CASE]()
report(rank=rank, **out)
