"""Rank script: common Horovod/PyTorch paths that must never go silently wrong (issue 32), one
case per run (``argv[1]``; ``argv[2:]``: the compressions, test names of tests/variants.py, or
'none'), each reporting what every rank saw.

- join: uneven data: rank 1 takes one step fewer and calls hvd.join(); with hvdcomp every rank
  raises JoinError within seconds (with 'none' Horovod's join works: the reference); or every
  rank takes the same steps and calls hvd.join(), which returns.
- scale: the same training three times per compression: without a loss scale; under
  torch.amp.GradScaler (growth every 2 steps, an overflow injected every 5th step, so the scale
  goes up and down by powers of two; Horovod's synchronize / unscale_ / skip_synchronize
  recipe); under a manual loss scale told with hvdcomp.set_loss_scale (1024 lowered to 1, then
  1000 and 3: not powers of two). Reports the final parameters' largest difference to the
  unscaled run's.
- absent: parameters without gradients: layer '0' frozen (requires_grad_(False)) after 6
  steps, then unfrozen; a head ('head_b') that every rank uses only every 3rd step. Under plain
  SGD neither moves while it has no gradient; the frozen layer's error memory waits.
- adamw: the user's AdamW kept (issue 30), per compression: the compressor drives its momentum
  (or, where its result is the step itself: BinSGDM, precondition='adam', AdamW applies that
  step at its rate); resume.
- misuse: settings that cannot work with the optimizer (precondition='adam' and BinSGDM under
  SGD with momentum, or under an Adam with amsgrad) raise UnsupportedOptimizerError on every
  rank at the first step; plain SGD and Adam/AdamW train.
"""
import sys
import time

import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import (batch, batch_loss, compression_for, compressor_object, flat,
                          grad_scaler_step, identical_across_ranks, load_digits_split)

CASE, NAMES = sys.argv[1], sys.argv[2:]
torch.set_num_threads(1)
hvd.init()
rank, out = hvd.rank(), {}
(xtr, ytr), _ = load_digits_split(0)


def model_and_opt(compression, lr=0.02, momentum=0.0, optimizer=torch.optim.SGD, seed=0,
                  model=None):
    torch.manual_seed(seed)
    model = model or torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 10))
    kwargs = ({"lr": lr, "momentum": momentum} if optimizer is torch.optim.SGD
              else {"lr": lr, "amsgrad": momentum == "amsgrad"})  # Adam: amsgrad where asked
    opt = hvd.DistributedOptimizer(optimizer(model.parameters(), **kwargs),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, opt


def loss_of(model, step):
    return batch_loss(model, xtr, ytr, step, rank)


def error_of(fn):
    t0 = time.perf_counter()
    try:
        fn()
    except hvdcomp.HvdcompError as exc:
        return f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    return None, time.perf_counter() - t0


# -- join ----------------------------------------------------------------------------------------
def case_join():
    """``argv[2]``: the compression; ``argv[3]``: 'uneven' (rank 1 takes one step fewer) or
    'even' (the same steps on every rank, then hvd.join() on every rank)."""
    name, kind = NAMES
    model, opt = model_and_opt(compression_for(name))

    def train_then_join():
        for step in range(4 if rank == 1 and kind == "uneven" else 5):
            opt.zero_grad()
            loss_of(model, step).backward()
            opt.step()
        return hvd.join()

    out["error"], out["seconds"] = error_of(train_then_join)
    if out["error"] is not None and rank == 0:
        # the script's own clean-up after the refusal: let Horovod's join (running in rank 1's
        # thread) complete, so that the job can end
        hvd.join.__wrapped__()
    out["identical"] = identical_across_ranks(model)


# -- loss scale ----------------------------------------------------------------------------------
STEPS, OVERFLOW_EVERY = 30, 5
MANUAL = [1024.0] * 8 + [1.0] * 8 + [1000.0] * 7 + [3.0] * 7


def train_scaled(name, mode):
    """``mode``: 'none' (no loss scale), 'grad_scaler' or 'manual'. The same overflow steps in
    each (a non-finite loss), skipped by the scaler or by the script."""
    hvdcomp.set_loss_scale(None)
    lr, momentum = compression_rates(name)
    compression = compression_for(name)
    model, opt = model_and_opt(compression, lr=lr, momentum=momentum)
    start = flat(model).clone()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) \
        if mode == "grad_scaler" else None
    scales = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, step)
        if step % OVERFLOW_EVERY == OVERFLOW_EVERY - 1:
            loss = loss * float("inf")
        if mode == "grad_scaler":
            scales.append(scaler.get_scale())
            grad_scaler_step(opt, scaler, loss)
            continue
        scale = MANUAL[step] if mode == "manual" else 1.0
        if mode == "manual":
            hvdcomp.set_loss_scale(scale)
        scales.append(scale)
        (loss * scale).backward()
        opt.synchronize()
        if all(torch.isfinite(p.grad).all() for p in model.parameters()):
            for p in model.parameters():
                p.grad /= scale
            with opt.skip_synchronize():
                opt.step()
    hvdcomp.set_loss_scale(None)
    return flat(model), scales, identical_across_ranks(model), float((flat(model) - start).abs().max())


def compression_rates(name):
    """The tests' (lr, momentum) of ``name`` (the examples' where the tests have none)."""
    import expect
    import variants
    return expect.lr_momentum(variants.preset_of(name), "digits-test", fallback="digits")


def case_scale():
    for name in NAMES:
        ref, _, same_ref, moved = train_scaled(name, "none")
        res = {"identical": [same_ref], "moved": moved}
        for mode in ("grad_scaler", "manual"):
            got, scales, same, _ = train_scaled(name, mode)
            res["identical"].append(same)
            res[mode] = {"scales": scales, "max_diff": float((got - ref).abs().max())}
        out[name] = res


# -- parameters without gradients ----------------------------------------------------------------
class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
        self.head_a = torch.nn.Linear(64, 10)
        self.head_b = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                          torch.nn.Linear(64, 10))

    def forward(self, x, use_b):
        h = self.trunk(x)
        return self.head_a(h) + (self.head_b(h) if use_b else 0.0)


def case_absent():
    for name in NAMES:
        lr, _ = compression_rates(name)
        compression = compression_for(name)
        model, opt = model_and_opt(compression, lr=lr, momentum=0.0, model=Branchy())
        comp = compressor_object(compression)  # None for Horovod's own
        unused_moves, frozen_moves, frozen_memory_kept, trunk_moved_after = [], [], [], None
        for step in range(24):
            use_b = step % 3 == 0
            frozen = 6 <= step < 16
            model.trunk[0].requires_grad_(not frozen)
            before_b = flat(model.head_b).clone()
            before_trunk = model.trunk[0].weight.detach().clone()
            memory = _state_of(comp, "trunk.0.weight") if comp is not None else {}
            opt.zero_grad()
            xb, yb = batch(xtr, ytr, step, rank)
            torch.nn.functional.cross_entropy(model(xb, use_b), yb).backward()
            opt.step()
            if not use_b:
                unused_moves.append(float((flat(model.head_b) - before_b).abs().max()))
            if frozen:
                frozen_moves.append(float((model.trunk[0].weight.detach()
                                           - before_trunk).abs().max()))
                kept = _state_of(comp, "trunk.0.weight") if comp is not None else {}
                frozen_memory_kept.append(_same(memory, kept))
            if step == 16:
                trunk_moved_after = float((model.trunk[0].weight.detach()
                                           - before_trunk).abs().max())
        out[name] = {"unused_moves": unused_moves, "frozen_moves": frozen_moves,
                     "frozen_memory_kept": frozen_memory_kept,
                     "trunk_moved_after": trunk_moved_after,
                     "identical": identical_across_ranks(model)}


def _state_of(comp, key):
    """Every state value of tensor ``key`` (the method's and a preconditioner's), as NumPy."""
    return {k: v for k, v in comp.state_dict()["state"].items() if k.split("#")[0] == key}


def _same(a, b):
    return sorted(a) == sorted(b) and all(_equal(a[k], b[k]) for k in a)


def _equal(x, y):
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_equal(u, v) for u, v in zip(x, y))
    return np.array_equal(np.asarray(x), np.asarray(y))


# -- settings that cannot work with the optimizer ------------------------------------------------
def case_misuse():
    combos = {
        "adam-precondition+sgd-momentum": (hvdcomp.Marsit(precondition="adam"),
                                           torch.optim.SGD, 0.9),
        "adam-precondition+adamw-amsgrad": (hvdcomp.TopK(precondition="adam"),
                                            torch.optim.AdamW, "amsgrad"),
        "binsgdm+sgd-momentum": (hvdcomp.BinSGDM(), torch.optim.SGD, 0.9),
        "binsgdm+adam-amsgrad": (hvdcomp.BinSGDM(), torch.optim.Adam, "amsgrad"),
        "adam-precondition+sgd": (hvdcomp.Marsit(precondition="adam"), torch.optim.SGD, 0.0),
        "binsgdm+sgd": (hvdcomp.BinSGDM(), torch.optim.SGD, 0.0),
        "adam-precondition+adamw": (hvdcomp.TopK(precondition="adam"), torch.optim.AdamW, 0),
        "binsgdm+adam": (hvdcomp.BinSGDM(), torch.optim.Adam, 0),
    }
    for what, (comp, optimizer, momentum) in combos.items():
        model, opt = model_and_opt(comp, lr=0.002, momentum=momentum, optimizer=optimizer)

        def one_step():
            opt.zero_grad()
            loss_of(model, 0).backward()
            opt.step()

        out[what], _ = error_of(one_step)
    # ranks that tell different loss scales
    model, opt = model_and_opt(hvdcomp.Marsit(), lr=0.02)
    hvdcomp.set_loss_scale(2.0 if rank == 0 else 4.0)

    def scaled_step():
        opt.zero_grad()
        loss_of(model, 0).backward()
        opt.step()

    out["different_scales"], _ = error_of(scaled_step)
    hvdcomp.set_loss_scale(None)


# -- the user's AdamW kept ------------------------------------------------------------------------
def case_adamw():
    """The user's torch.optim.AdamW, unchanged, with each compression of ``argv[2:]`` (reported
    under its name): after Adam's 10 dense warm-up steps the compressor sends each rank's
    momentum, and the gradient AdamW receives is the synchronised momentum, which AdamW's own
    update keeps as its exp_avg (where the result is the step itself, BinSGDM or
    precondition='adam', AdamW's update is lr times it); a checkpoint at step 15 resumes
    bit-identically."""
    for name in NAMES:
        out[name] = adamw_run(name)


def adamw_run(name):
    """``case_adamw``'s run of compression ``name``: the fields it reports."""
    def build():
        compression = compression_for(name)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        opt = hvd.DistributedOptimizer(
            torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01),
            named_parameters=model.named_parameters(), compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, opt, compressor_object(compression)

    def steps(model, opt, comp, start, stop, log=None):
        for step in range(start, stop):
            opt.zero_grad()
            loss = loss_of(model, step)
            loss.backward()
            w = model[0].weight
            before = w.detach().clone()
            opt.step()
            if log is not None:
                # the update AdamW applied, its decoupled weight decay taken out, in units of
                # lr times the gradient it was given (the compressor's result)
                moved = before * (1 - 3e-3 * 0.01) - w.detach()
                log.append({"step": step, "loss": float(loss.detach()),
                            "exp_avg_is_grad": bool(torch.equal(opt.state[w]["exp_avg"], w.grad)),
                            "update_is_lr_grad": float((moved - 3e-3 * w.grad).abs().max()
                                                       / (3e-3 * w.grad.abs().max())),
                            "magnitudes": int(torch.unique(w.grad.abs()).numel()),
                            "compressed": comp.last_stats.compressed_elements,
                            "bytes_sent": comp.last_stats.bytes_sent,
                            "identical": identical_across_ranks(model)})

    model, opt, comp = build()
    log = []
    steps(model, opt, comp, 0, 15, log)
    saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
             "opt": __import__("copy").deepcopy(opt.state_dict()), "comp": comp.state_dict()}
    steps(model, opt, comp, 15, 30, log)
    model2, opt2, comp2 = build()
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    comp2.load_state_dict(saved["comp"])
    steps(model2, opt2, comp2, 15, 30)
    return {"log": log, "final": flat(model).tolist()[:50],
            "resumed_equal": bool(torch.equal(flat(model), flat(model2)))}


{"join": case_join, "scale": case_scale, "absent": case_absent, "misuse": case_misuse,
 "adamw": case_adamw}[CASE]()
report(rank=rank, **out)
