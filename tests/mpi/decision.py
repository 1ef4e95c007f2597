"""Rank script: the compress-or-pass decision (hvdcomp.decision) on real ranks, through the stock
hvd.DistributedOptimizer(SGD) on the digits MLP (hidden 256: tensors of 16384, 2560, 256 and 10
elements, so the three candidates differ), with HVDCOMP_DECISION=measure (set by the test).

Args: one or more cases of three each, ``compression lr mode``, run one after the other in this
launch (each reports with ``case='<compression>-<mode>'``); mode: 'carry', 'resume',
'resume-pass', 'adam-carry', 'aside' (with 'sgd' or 'adamw' for the compression: BinSGDM's own,
see ``aside``), 'half', 'unlike' (see ``adam_carry``) or 'adam-wait' (see ``adam_wait``).

- carry: STEPS steps; every rank records, per step, the threshold in force (``last_stats``), its
  parameters' digest, the applied step of each tensor (``p.grad`` after ``opt.step()``: what
  Horovod's DistributedOptimizer left there) and its own gradient of the same batch (a twin model
  without Horovod), and its error-feedback memory after the step. Rank 0 reports, per tensor,
  every run of steps in which the tensor was passed right after being compressed: the sum of
  the applied steps over the run, and the sum of the mean gradients over the run plus the mean
  memory before the run (they must be equal: the memory is carried, not dropped; steps passed
  in float16 add their rounding, bounded per step by 2**-9 times the largest |gradient|).
- half: the float16 candidate (``hvdcomp.decision.HALF``) against Horovod's own fp16 (see
  ``half``).
- resume: a run until the decision holds a choice (at least step MIN_SAVE), a checkpoint
  (model, optimizer, compressor) through torch.save, AFTER more steps; then a fresh model,
  optimizer and compressor load it and run the same steps. Reported: both runs' thresholds and
  digests per step.
- resume-pass: RESUME_COMPRESSED compressed steps (HVDCOMP_DECISION=compress set by the test), a
  checkpoint; a fresh model, optimizer and compressor (a new process's: no node layout known yet)
  load it and pass every tensor from their first step (the threshold set by hand). Rank 0
  reports, per tensor, the largest difference between that applied step and the mean gradient
  plus the mean memory that was saved (they must be equal: the memory is carried, not dropped or
  misplaced), the memory's and the step's scale, and whether the step passed every tensor.
- adam-carry: under the user's ``torch.optim.AdamW`` (HVDCOMP_DECISION=compress set by the test),
  the step after ``ADAM_COMPRESSED`` compressed ones (past the dense warm-up) passed by hand (the
  decision's threshold set to its last candidate): every rank reports, per tensor, the largest
  difference between Adam's moments after that step and what they must be when the memory goes
  to the momentum, ``m = b1 m0 + (1 - b1) mean(g) + mean(e)`` and ``v = b2 v0 + (1 - b2)
  mean(g)**2``, the largest ``|mean(e)|`` (something was carried) and the moments' scale.
"""
import copy
import io
import math
import sys

import numpy as np
import torch
import horovod.torch as hvd
from mpi4py import MPI

from hvdcomp.comm.hierarchy import shard_bounds

from report import cases, report
from torch_common import (batch, build, compression_for, compressor_object, digest,
                          identical_across_ranks, load_digits_split, make_model)
from models import WithUnused  # tests/models.py (torch_common puts tests/ on the path)

# The probe settles 2 steps per switch (hvdcomp.decision) and observes every other step while
# it probes (quiet steps): with retakes it can take 50-60 steps of this model.
STEPS, MIN_SAVE, MAX_SAVE, AFTER = 100, 14, 100, 4
hvd.init()
(xtr, ytr), _ = load_digits_split(0)
world = MPI.COMM_WORLD


def step(model, opt, i):
    xb, yb = batch(xtr, ytr, i, hvd.rank())
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()


def local_gradients(model, i):
    """This rank's gradient of batch ``i`` at the model's current parameters (float64)."""
    twin = copy.deepcopy(model)
    xb, yb = batch(xtr, ytr, i, hvd.rank())
    torch.nn.functional.cross_entropy(twin(xb), yb).backward()
    return {n: p.grad.double().numpy().ravel().copy() for n, p in twin.named_parameters()
            if p.grad is not None}


def mean_over_ranks(arrays):
    return {k: world.allreduce(v, op=MPI.SUM) / world.size for k, v in arrays.items()}


def memory_of(comp, names):
    """This rank's error-feedback memory per parameter name (zeros where none), float64, full
    size. In node stages (hvdcomp.hierarchical) a rank holds its shard's memory, of its node's
    mean gradient: placed at the shard, times the ranks per node, so that the mean over ranks
    is the mean over nodes (PowerSGD's shares are whole tensors: the owner's memory is of full
    size, times the ranks per node likewise)."""
    state = comp.state_dict()["state"]
    hier = getattr(comp.engine.method, "hierarchy", None)
    out = {}
    for n, size in names.items():
        held = state_of(state, n)
        out[n] = np.zeros(size)
        memory = np.asarray(held, np.float64).ravel() if held is not None else out[n]
        whole = any(k.endswith(n + "#owner") for k in state)  # PowerSGD's owner's memory
        if memory.size == size:
            out[n] = memory * (hier.local_size if whole and held is not None else 1)
        else:
            bounds = shard_bounds(size, hier.local_size)
            out[n][bounds[hier.local_rank]:bounds[hier.local_rank + 1]] = \
                memory * hier.local_size
    return out


def offer_half(comp):
    """Give ``comp``'s decision, before its first step, a link of bandwidth alone (no latency),
    on which halving the bytes pays (``hvdcomp.decision.halving_pays``, tested in
    test_decision.py): its float16 candidate is then offered whatever this machine's link
    measures, and no candidate's floor rules it out."""
    from hvdcomp.comm.link import Link
    comp.decision.link = Link(latency=0.0, seconds_per_byte=1e-8)


def carry(name, lr):
    comp_arg = compression_for(name)
    model, opt = build(comp_arg, lr, 0.0)
    comp = compressor_object(comp_arg)
    offer_half(comp)  # every candidate runs, the float16 one too
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    thresholds, identical, applied, grads, memories = [], 0, [], [], [memory_of(comp, sizes)]
    halves, largest = [], []  # per step: passed in float16; the largest |gradient| of any rank
    for i in range(STEPS):
        local = local_gradients(model, i)
        grads.append(mean_over_ranks(local))
        largest.append({n: world.allreduce(float(abs(g).max()), op=MPI.MAX)
                        for n, g in local.items()})
        threshold = comp.decision.threshold  # in force for this step
        halves.append(comp.decision.passes_half())
        step(model, opt, i)
        thresholds.append(threshold)
        applied.append({n: p.grad.double().numpy().ravel().copy()
                        for n, p in model.named_parameters()})
        memories.append(mean_over_ranks(memory_of(comp, sizes)))
        identical += identical_across_ranks(model)
    runs = []
    for n, size in sizes.items():
        compressed = [size >= t for t in thresholds]
        i = 1
        while i < STEPS:
            if compressed[i - 1] and not compressed[i]:
                j = i
                while j < STEPS and not compressed[j]:
                    j += 1
                sent = sum(applied[t][n] for t in range(i, j))
                owed = sum(grads[t][n] for t in range(i, j)) + memories[i][n]
                # a step passed in float16 rounds each rank's gradient and the sum
                rounding = sum(largest[t][n] for t in range(i, j) if halves[t]) * 2.0 ** -9
                runs.append({"tensor": n, "steps": [i, j],
                             "memory": float(abs(memories[i][n]).max()),
                             "error": float(abs(sent - owed).max()),
                             "scale": float(abs(owed).max()), "fp16_rounding": rounding})
                i = j
            i += 1
    return dict(thresholds=[str(t) for t in thresholds], identical=identical,
                steps=STEPS, runs=runs, phase=comp.decision.phase, halves=halves)


HALF_STEPS = 4


def half(name, lr):
    """Step 0 as the decision starts (every tensor passed), then ``HALF_STEPS`` steps with the
    decision held on its float16 candidate, then one passing in float32, one compressing and
    one in float16 again. Per step: the largest difference between the applied step and
    Horovod's own fp16 average of this rank's gradients (``hvd.allreduce`` of them in float16,
    as ``hvd.Compression.fp16`` sends them) and the exact mean, Horovod's bytes per rank, and
    the candidate in force. Then the candidates of a compressor with ``on_nonfinite='raise'``."""
    from hvdcomp.decision import HALF
    comp_arg = compression_for(name)
    model, opt = build(comp_arg, lr, 0.0)
    comp = compressor_object(comp_arg)
    offer_half(comp)
    step(model, opt, 0)
    candidates = list(comp.decision.thresholds)
    comp.decision.phase = "fixed"  # held where the test puts it
    plan = [HALF] * HALF_STEPS + [math.inf, candidates[0], HALF]
    rows = []
    for i, candidate in enumerate(plan, start=1):
        comp.decision.current = candidates.index(candidate)
        local = local_gradients(model, i)
        exact = mean_over_ranks(local)
        fp16 = {n: hvd.allreduce(torch.from_numpy(g).float().half(), op=hvd.Average,
                                 name=f"reference.{i}.{n}").float().double().numpy()
                for n, g in local.items()}
        step(model, opt, i)
        applied = {n: p.grad.double().numpy().ravel() for n, p in model.named_parameters()}
        rows.append({"candidate": str(candidate), "half": comp.decision.passes_half(),
                     "fp16_gap": max(float(abs(applied[n] - fp16[n]).max()) for n in applied),
                     "exact_gap": max(float(abs(applied[n] - exact[n]).max()
                                            / abs(exact[n]).max()) for n in applied),
                     "horovod_bytes": comp.last_stats.horovod_bytes,
                     "identical": identical_across_ranks(model)})
    import hvdcomp
    strict = hvdcomp.Marsit(on_nonfinite="raise")  # every non-finite step caught: no float16
    strict_model, strict_opt = build(strict, lr, 0.0)
    step(strict_model, strict_opt, 0)
    return dict(candidates=[str(c) for c in candidates], steps=rows,
                strict_candidates=[str(c) for c in strict.decision.thresholds])


def resume(name, lr):
    comp_arg = compression_for(name)
    model, opt = build(comp_arg, lr, 0.0)
    comp = compressor_object(comp_arg)
    i, saved = 0, None
    while saved is None and i < MAX_SAVE:
        step(model, opt, i)
        i += 1
        if i >= MIN_SAVE and comp.decision.phase == "hold":
            saved = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "comp": comp.state_dict()}, saved)
    start, first = i, {"thresholds": [], "digests": []}
    for i in range(start, start + AFTER):
        first["thresholds"].append(str(comp.decision.threshold))
        step(model, opt, i)
        first["digests"].append(digest(model))
    if saved is None:
        return dict(saved_at=None)
    saved.seek(0)
    state = torch.load(saved, weights_only=False)
    comp_arg2 = compression_for(name)
    model2, opt2 = build(comp_arg2, lr, 0.0, state=state)
    comp2 = compressor_object(comp_arg2)
    second = {"thresholds": [], "digests": []}
    for i in range(start, start + AFTER):
        second["thresholds"].append(str(comp2.decision.threshold))
        step(model2, opt2, i)
        second["digests"].append(digest(model2))
    return dict(saved_at=start, first=first, second=second,
                mode=comp2.decision.mode, switches=comp.decision.switches)


RESUME_COMPRESSED = 5


def resume_pass(name, lr):
    comp_arg = compression_for(name)
    model, opt = build(comp_arg, lr, 0.0)
    comp = compressor_object(comp_arg)
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    for i in range(RESUME_COMPRESSED):
        step(model, opt, i)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "comp": comp.state_dict()}, saved)
    memory = mean_over_ranks(memory_of(comp, sizes))
    saved.seek(0)
    comp_arg2 = compression_for(name)
    model2, opt2 = build(comp_arg2, lr, 0.0, state=torch.load(saved, weights_only=False))
    comp2 = compressor_object(comp_arg2)
    assert comp2 is not comp
    comp2.decision.current = -1  # pass every tensor from the first step on
    grads = mean_over_ranks(local_gradients(model2, RESUME_COMPRESSED))
    step(model2, opt2, RESUME_COMPRESSED)
    out = {}
    for n, p in model2.named_parameters():
        applied, owed = p.grad.double().numpy().ravel(), grads[n] + memory[n]
        out[n] = {"error": float(abs(applied - owed).max()), "scale": float(abs(owed).max()),
                  "memory": float(abs(memory[n]).max())}
    return dict(tensors=out, identical=identical_across_ranks(model2),
                passed=comp2.last_stats.compressed_elements == 0)


ADAM_COMPRESSED = 14  # 10 dense warm-up steps (hvdcomp.algorithms.adam.WARMUP), 4 compressed


def build_adamw(name, lr):
    """``(model, Horovod's optimizer, compressor)``: the digits MLP (seed 0, rank 0's weights)
    under the user's ``torch.optim.AdamW`` (weight decay 0.01) wrapped by the stock
    ``hvd.DistributedOptimizer`` with compression ``name``."""
    comp_arg = compression_for(name)
    torch.manual_seed(0)
    model = make_model()
    adamw = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    # Horovod's optimizer is a new instance of a subclass of AdamW: its state is the one used
    opt = hvd.DistributedOptimizer(adamw, named_parameters=model.named_parameters(),
                                   compression=comp_arg)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, opt, compressor_object(comp_arg)


def adam_carry(name, lr, unlike=False):
    """See the module docstring; ``unlike``: rank 0 alone carries its memory into the gradient
    (``FollowAdam.carry`` as the plain one, the others send ``[g, e]``): the ranks' uncompressed
    sums differ in size, and every rank reports the error it raised (the plain carry undone
    after the step, for the launch's later cases)."""
    from hvdcomp import preconditioning
    follow_adams_carry = preconditioning.FollowAdam.carry
    if unlike and hvd.rank() == 0:
        preconditioning.FollowAdam.carry = lambda self, carry, store, entry: carry(store, entry)
    model, opt, comp = build_adamw(name, lr)
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    for i in range(ADAM_COMPRESSED):
        step(model, opt, i)
    b1, b2 = opt.param_groups[0]["betas"]
    params = dict(model.named_parameters())
    before = {n: {k: opt.state[p][k].double().numpy().ravel().copy()
                  for k in ("exp_avg", "exp_avg_sq")} for n, p in params.items()}
    grads = mean_over_ranks(local_gradients(model, ADAM_COMPRESSED))
    memory = mean_over_ranks(memory_of(comp, sizes))
    comp.decision.current = -1  # pass every tensor from this step on
    if unlike:
        try:
            step(model, opt, ADAM_COMPRESSED)
            raised = None
        except Exception as exc:  # noqa: BLE001 - reported
            raised = f"{type(exc).__name__}: {exc}"
        finally:
            preconditioning.FollowAdam.carry = follow_adams_carry
        return dict(raised=raised, step=comp.engine.step, digest=digest(model))
    step(model, opt, ADAM_COMPRESSED)
    out = {}
    for n, p in params.items():
        m0, v0 = before[n]["exp_avg"], before[n]["exp_avg_sq"]
        m = opt.state[p]["exp_avg"].double().numpy().ravel()
        v = opt.state[p]["exp_avg_sq"].double().numpy().ravel()
        want_m = b1 * m0 + (1 - b1) * grads[n] + memory[n]
        want_v = b2 * v0 + (1 - b2) * grads[n] ** 2
        out[n] = {"m_error": float(abs(m - want_m).max()), "m_scale": float(abs(want_m).max()),
                  "v_error": float(abs(v - want_v).max()), "v_scale": float(abs(want_v).max()),
                  "memory": float(abs(memory[n]).max()),
                  "passed": comp.last_stats.compressed_elements == 0}
    return dict(tensors=out, identical=identical_across_ranks(model))


WAIT_STEPS = 24


def adam_wait(name, lr):
    """Under the user's ``torch.optim.AdamW`` with the decision measuring: WAIT_STEPS steps;
    every rank records the threshold in force at each step (its tensors are dense for Adam's
    first 10 steps, ``hvdcomp.preconditioning.FollowAdam``) and whether its parameters are
    bit-identical to the other ranks' after it."""
    model, opt, comp = build_adamw(name, lr)
    thresholds, identical = [], 0
    for i in range(WAIT_STEPS):
        thresholds.append(str(comp.decision.threshold))
        step(model, opt, i)
        identical += identical_across_ranks(model)
    return dict(thresholds=thresholds, identical=identical, steps=WAIT_STEPS,
                adam_steps=int(opt.state[next(model.parameters())]["step"]))


ASIDE_STEPS, ASIDE_COMPRESSED, ASIDE_NAN = 12, (5, 6, 7), 3


def moments_of(comp, names):
    """This rank's BinSGDM moments per parameter name: (m, v) float64, or None before any."""
    state = comp.state_dict()["state"]
    held = {n: state_of(state, n) for n in names}
    return {n: None if h is None else tuple(np.asarray(a, np.float64).ravel() for a in h)
            for n, h in held.items()}


def state_of(state, name):
    """The entry of a compressor's saved ``state`` held for parameter ``name`` (its key ends
    with the name; keys with '#' are a method's other parts), or None."""
    keys = [k for k in state if k.endswith(name) and "#" not in k]
    return state[keys[0]] if keys else None


def aside(name, lr):
    """BinSGDM stepping aside (hvdcomp.stepaside) under the stock DistributedOptimizer: SGD
    (lr ``lr``, no momentum) or, with name 'adamw', AdamW. Steps ``ASIDE_COMPRESSED`` are
    voted (the threshold set by hand), the others passed; at step ``ASIDE_NAN`` rank 1's loss is
    NaN (the step is synchronized and not applied). Every rank keeps a float64 twin of its own
    moments from its own gradients (``hvdcomp.methods.binsgdm.math.update_moments``) and reports,
    per step: the largest gap between BinSGDM's moments and the twin's (relative), for a passed
    step the largest gap between the applied step (SGD: ``p.grad``; AdamW: Adam's first moment
    after the step, which ``ThroughAdam`` makes the step) and the mean over ranks of the twins'
    ``clip(m / v)`` (times the mean over ranks of ``mean(v)`` under SGD; under AdamW times the
    factor of ``alg.adam_scale`` from the twins' ``g / v`` at ``alg.sample_positions``, clipped
    to [-1, 1]), whether Horovod's
    allreduce carried the message (``horovod_bytes``) and whether nothing was voted; at the NaN
    step, whether every applied value is NaN; whether the parameters are identical; and for a
    layer the model never uses (its gradient Horovod's zero fill), whether BinSGDM holds state
    for it and how far it moved."""
    import hvdcomp
    from hvdcomp.methods.binsgdm import math as alg
    comp = hvdcomp.BinSGDM(decision="compress")
    torch.manual_seed(0)
    model = WithUnused(make_model())
    unused = [n for n, _ in model.named_parameters() if n.startswith("unused")]
    adam = name == "adamw"
    inner = (torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01) if adam
             else torch.optim.SGD(model.parameters(), lr=lr))
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                   compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    params = {n: p for n, p in model.named_parameters() if n not in unused}
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in unused}
    twin = {n: None for n in params}
    steps = []
    for i in range(ASIDE_STEPS):
        comp.decision.current = 0 if i in ASIDE_COMPRESSED else -1
        grads = local_gradients(model, i)
        xb, yb = batch(xtr, ytr, i, hvd.rank())
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        poisoned = i == ASIDE_NAN
        (loss * float("nan") if poisoned and hvd.rank() == 1 else loss).backward()
        row = {"step": i}
        if poisoned:
            opt.synchronize()
            row["all_nan"] = all(bool(torch.isnan(p.grad).all()) for p in params.values())
            for p in params.values():
                p.grad.zero_()
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
            want = {}
            for n in params:
                twin[n] = alg.update_moments(grads[n], twin[n], 0.9, 0.9)
                m, v = twin[n]
                u = mean_over_ranks({n: np.clip(m / (v + 1e-8), -1, 1)})[n]
                s = world.allreduce(float(v.mean()), op=MPI.SUM) / world.size
                if adam:  # scaled to the ranks' mean gradient (BinSGDM.adam_step), clipped
                    at = alg.sample_positions(u.size)
                    z = np.zeros(alg.SAMPLES)
                    z[:len(at)] = grads[n][at] / (v[at] + 1e-8)
                    c = alg.adam_scale(mean_over_ranks({n: z})[n], len(at), world.size)
                    want[n] = np.clip(u * c, -1, 1)
                else:
                    want[n] = u * s
            applied = {n: (opt.state[p]["exp_avg"] if adam else p.grad).double().numpy().ravel()
                       for n, p in params.items()}
            if i not in ASIDE_COMPRESSED and not (adam and i == 0):  # Adam's first: no state
                row["step_gap"] = max(float(abs(applied[n] - want[n]).max()
                                            / (abs(want[n]).max() + 1e-12)) for n in params)
            row["voted"] = comp.last_stats.compressed_elements
            row["horovod_bytes"] = comp.last_stats.horovod_bytes
        ours = moments_of(comp, list(params) + unused)
        row["unused_state"] = [n for n in unused if ours[n] is not None]
        row["unused_moved"] = max(float(abs(p.detach() - before[n]).max())
                                  for n, p in model.named_parameters() if n in unused)
        row["moment_gap"] = max(float(abs(a - b).max() / (abs(b).max() + 1e-12))
                                for n in params for a, b in zip(ours[n], twin[n]))
        row["identical"] = identical_across_ranks(model)
        steps.append(row)
    return dict(steps=steps)


MODES = {"carry": carry, "resume": resume, "resume-pass": resume_pass, "adam-carry": adam_carry,
         "aside": aside, "half": half, "adam-wait": adam_wait,
         "unlike": lambda name, lr: adam_carry(name, lr, unlike=True)}
for name, lr, mode in cases(sys.argv[1:], 3):
    report(case=f"{name}-{mode}", rank=hvd.rank(), **MODES[mode](name, float(lr)))
