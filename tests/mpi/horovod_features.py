"""Rank script: Horovod features users combine with compression (issue 17), one case per run
(``argv[1]``), each reporting what every rank saw.

- ops: op=Min/Max/Product on hvd.allreduce raise UnsupportedOpError on every rank (state left
  as it was: a following Average call gives the exact mean); op=Sum and prescale/postscale
  factors give the right value; DistributedOptimizer(op=hvd.Adasum) is refused at its step.
- setup: ranks with different compressors or settings (class, seed, fusion) raise
  SetupMismatchError on every rank, naming the setting and both values.
- amp: torch.amp GradScaler (fp16 autocast on CPU, Horovod's documented synchronize / unscale_ /
  skip_synchronize pattern) with the default on_nonfinite: overflowing steps come back non-finite
  on every rank, GradScaler backs off as with Horovod's own allreduce, the loss goes down and
  every rank stays bit-identical.
- reuse: two trainings in one process with the bare class: the second equals a training with a
  fresh instance.
- params: ranks whose optimizers hold different parameters (rank 1 froze a layer) raise
  RankMismatchError at the first backward naming the parameter, within seconds.
- small: a model's small float32 tensors (under min_compress_numel) are summed by Horovod's own
  allreduce (what hvd.Compression.none gives, bit for bit, for op=Average and op=Sum) while the
  large ones are compressed; a NaN in a small tensor on one rank still skips the step on every
  rank (NaN for it, zeros for the others, state unchanged) or, with on_nonfinite='raise', raises
  on every rank naming the tensor and the rank.
- all_small: a model whose every tensor is small: hvdcomp's traffic is one all-gather per steady
  step (the batch's agreement, which also tells whether any rank has a non-finite tensor), each
  tensor's entry is kept from step to step (no new objects per tensor per step), and a NaN on
  rank 1 still skips the step on every rank or raises naming the tensor and the rank.
- sets (4 ranks): process sets [0, 1] and [2, 3]: hvd.allreduce(op=Average, process_set=own)
  gives each set's own mean; a training in each set stays identical within the set; a set that
  does other work meanwhile does not hang the other.
- set_runtimes (4 ranks, sets [0, 1] and [2, 3]): one compressor instance, and the bare class,
  serve the own set and the global set in turn, each set with its own runtime (state, steps):
  the means are each set's, the trainings identical within their set; the two-set checkpoint
  restores both sets into a fresh instance bit for bit (state_dict(all_ranks=True) refuses it on
  every rank); a one-set checkpoint (this rank's, or the set's ranks gathered) records its set,
  loads into a fresh instance before any step, and the resumed training equals the
  uninterrupted one; a checkpoint that records no set, restored before the first tensor, then
  met in another set raises on every rank.
"""
import copy
import sys
import time

import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from report import report
from torch_common import (batch, digest, grad_scaler_step, identical_across_ranks,
                          load_digits_split, make_model)

CASE = sys.argv[1]
torch.set_num_threads(1)
if CASE in ("sets", "set_runtimes"):
    SETS = [hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])]
    hvd.init(process_sets=SETS)
else:
    hvd.init()
rank, out = hvd.rank(), {}
(xtr, ytr), _ = load_digits_split(0)


def error_of(fn, kind=hvdcomp.HvdcompError):
    try:
        fn()
    except kind as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def train(model, opt, steps, first=0, process_set_rank=None):
    losses = []
    for step in range(first, first + steps):
        xb, yb = batch(xtr, ytr, step, rank if process_set_rank is None else process_set_rank)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def case_ops():
    comp = hvdcomp.TopK(ratio=0.05, seed=1, min_compress_numel=64)
    g = torch.arange(2000, dtype=torch.float32) * (rank + 1)
    for op in ("Min", "Max", "Product"):
        out[op] = error_of(lambda: hvd.allreduce(g, name="g", op=getattr(hvd, op),
                                                 compression=comp), hvdcomp.UnsupportedOpError)
    out["store_after_refusals"] = comp.store.keys()
    small = torch.full((10,), float(rank + 1))  # below min_compress_numel: exact
    out["sum"] = hvd.allreduce(small, name="s", op=hvd.Sum, compression=comp).tolist()
    out["avg"] = hvd.allreduce(small, name="s", op=hvd.Average, compression=comp).tolist()
    out["prescaled_sum"] = hvd.allreduce(small, name="s", op=hvd.Sum, prescale_factor=0.5,
                                         compression=comp).tolist()
    out["postscaled_avg"] = hvd.allreduce(small, name="s", op=hvd.Average,
                                          postscale_factor=3.0, compression=comp).tolist()
    model = make_model(hidden=32)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcomp.Marsit(), op=hvd.Adasum)
    out["adasum"] = error_of(lambda: train(model, opt, 1), hvdcomp.UnsupportedOpError)


def case_setup():
    pairs = {"class": (hvdcomp.Marsit, hvdcomp.TopK), "seed": (hvdcomp.Marsit, hvdcomp.Marsit),
             "fusion": (hvdcomp.Marsit, hvdcomp.Marsit)}
    args = {"class": ({}, {}), "seed": ({"seed": 1}, {"seed": 2}),
            "fusion": ({}, {"fusion": "auto"})}
    for what, classes in pairs.items():
        comp = classes[rank % 2](**args[what][rank % 2])
        out[what] = error_of(lambda: hvd.allreduce(torch.ones(3000), name=f"x.{what}",
                                                   compression=comp),
                             hvdcomp.SetupMismatchError)


def case_amp():
    """GradScaler with fp16 autocast on CPU: Horovod's AMP recipe; ``argv[2]`` the compression."""
    compression = {"none": hvd.Compression.none, "marsit": hvdcomp.Marsit(seed=2)}[sys.argv[2]]
    torch.manual_seed(0)
    model = make_model(hidden=64)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)  # the first steps overflow fp16
    losses, scales, identical = [], [], 0
    for step in range(40):
        xb, yb = batch(xtr, ytr, step, rank)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        grad_scaler_step(opt, scaler, loss)
        losses.append(float(loss.detach()))
        scales.append(float(scaler.get_scale()))
        identical += identical_across_ranks(model)
    out.update(first_loss=float(np.mean(losses[:5])), last_loss=float(np.mean(losses[-5:])),
               scales=scales, identical=identical, finite=all(
                   bool(torch.isfinite(p).all()) for p in model.parameters()))
    if isinstance(compression, hvdcomp.BatchedCompressor):
        out["skipped"] = compression.state_dict()["skipped"]


def case_reuse():
    def run(compression):
        torch.manual_seed(1)
        model = make_model(hidden=32)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters(),
                                       compression=compression)
        train(model, opt, 5)
        return digest(model)

    first = run(hvdcomp.TopK)  # a first training with the bare class (its default instance)
    out["second_bare"] = run(hvdcomp.TopK)  # e.g. the next learning rate of a sweep
    out["fresh"] = run(hvdcomp.TopK(ratio=0.01))  # what a new instance gives
    out["first"] = first


def case_params():
    model = make_model(hidden=32)
    if rank == 1:
        model[2].weight.requires_grad_(False)  # this rank froze one layer's weight
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcomp.Marsit())
    t0 = time.monotonic()
    out["error"] = error_of(lambda: train(model, opt, 1), hvdcomp.RankMismatchError)
    out["seconds"] = time.monotonic() - t0


def case_sets():
    own = SETS[rank // 2]
    for name, make in (("marsit", lambda: hvdcomp.Marsit(min_compress_numel=10**6)),
                       ("topk", lambda: hvdcomp.TopK(min_compress_numel=10**6))):
        comp = make()
        x = torch.full((3000,), float(rank))
        out[name] = float(hvd.allreduce(x, name="x", op=hvd.Average, process_set=own,
                                        compression=comp).mean())
    # compressed, in both sets: the mean over the set of one constant per rank
    comp = hvdcomp.TopK(ratio=1.0)
    out["topk_compressed"] = hvd.allreduce(torch.full((3000,), float(rank)), name="y",
                                           process_set=own, compression=comp)[:3].tolist()
    # set 0 trains while set 1 does unrelated Horovod work: nobody waits for the other set
    torch.manual_seed(0)  # the same initial weights on every rank
    model = make_model(hidden=32)
    if rank < 2:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters(),
                                       compression=hvdcomp.Marsit(seed=1), process_set=own)
        train(model, opt, 5)
    else:
        for i in range(20):
            hvd.allreduce(torch.ones(10), name=f"other.{i}", process_set=own)
    out["digest"] = digest(model)


def case_set_runtimes():
    own = SETS[rank // 2]
    shared = hvdcomp.TopK(ratio=1.0, decision="compress")  # exact: the mean of every element
    out["means"] = [float(hvd.allreduce(torch.full((3000,), float(rank)), name="x",
                                        process_set=ps, compression=shared).mean())
                    for ps in (own, hvd.global_process_set, own)]
    out["shared_steps"] = sorted([list(k or ()), rt.engine.step]
                                 for k, rt in shared.runtimes.by_ranks.items())

    def trained(model, process_set, steps, compression):
        """``model`` after ``steps`` steps, and its optimizer (its hooks stay on the model)."""
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05), compression=compression,
            named_parameters=model.named_parameters(),
            **({} if process_set is None else {"process_set": process_set}))
        train(model, opt, steps)
        return model, opt

    def fresh():
        torch.manual_seed(0)  # the same initial weights on every rank
        return make_model(hidden=32)

    # the bare class: its default instance serves the own set, then every rank
    in_set, _ = trained(fresh(), own, 3, hvdcomp.Marsit)
    in_world, _ = trained(fresh(), None, 3, hvdcomp.Marsit)
    from mpi4py import MPI
    digests = MPI.COMM_WORLD.allgather([digest(in_set), digest(in_world)])
    out["set_identical"] = digests[rank][0] == digests[rank ^ 1][0]
    out["world_identical"] = len({d[1] for d in digests}) == 1
    saved = hvdcomp.Marsit.state_dict()
    out["saved_sets"] = [part["process_set"] for part in saved.get("process_sets", [])]
    restored = hvdcomp.Marsit()
    restored.load_state_dict(saved)
    again = restored.state_dict()
    out["restored_same"] = len(again["process_sets"]) == len(saved["process_sets"]) and all(
        a["step"] == b["step"] and same_state(a["state"], b["state"])
        for a, b in zip(again["process_sets"], saved["process_sets"]))
    out["all_ranks"] = error_of(lambda: hvdcomp.Marsit.state_dict(all_ranks=True))
    # one set's checkpoint, loaded before any step: the resume equals the run it continues
    comp = hvdcomp.Marsit(seed=3, decision="compress")  # no timing-driven choice
    model, opt = trained(fresh(), own, 2, comp)
    checkpoint, weights = comp.state_dict(), copy.deepcopy(model.state_dict())
    gathered = comp.state_dict(all_ranks=True)  # the set's ranks gathered
    out["one_set"] = [checkpoint["process_set"], gathered["process_set"]]
    from_gathered = hvdcomp.Marsit(seed=3, decision="compress")
    from_gathered.load_state_dict(gathered)
    out["gathered_same"] = same_state(from_gathered.state_dict()["state"], checkpoint["state"])
    resumed = hvdcomp.Marsit(seed=3, decision="compress")
    resumed.load_state_dict(checkpoint)
    twin = fresh()
    twin.load_state_dict(weights)
    twin_opt = hvd.DistributedOptimizer(torch.optim.SGD(twin.parameters(), lr=0.05),
                                        compression=resumed, process_set=own,
                                        named_parameters=twin.named_parameters())
    train(model, opt, 2, first=2)
    train(twin, twin_opt, 2, first=2)
    out["resume_identical"] = digest(model) == digest(twin)
    # a checkpoint that records no set (as written before), restored before the first tensor,
    # went to the global set: a first tensor in another set raises on every rank
    world = hvdcomp.TopK(ratio=1.0, decision="compress")
    hvd.allreduce(torch.ones(3000), name="z", compression=world)
    unrecorded = {k: v for k, v in world.state_dict().items() if k != "process_set"}
    restored = hvdcomp.TopK(ratio=1.0, decision="compress")
    restored.load_state_dict(unrecorded)
    out["unplaced"] = error_of(lambda: hvd.allreduce(torch.ones(3000), name="z", process_set=own,
                                                     compression=restored))


def same_state(a, b):
    """Whether two ``StateStore.to_host()`` results hold the same keys and bits."""
    flat = lambda v: v if isinstance(v, tuple) else (v,)  # noqa: E731
    return sorted(a) == sorted(b) and all(
        len(flat(a[k])) == len(flat(b[k])) and all(
            np.array_equal(x, y) for x, y in zip(flat(a[k]), flat(b[k]))) for k in a)


def case_small():
    xb, yb = batch(xtr, ytr, 0, rank)

    def fresh(op=hvd.Average, **settings):
        """A new model (the same weights on every rank) and its optimizer with Marsit."""
        torch.manual_seed(0)
        model = make_model(hidden=32)  # weights of 2048, 1024 and 320 elements, biases
        comp = hvdcomp.Marsit(seed=1, **settings)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=model.named_parameters(),
                                       compression=comp, op=op)
        return model, dict(model.named_parameters()), comp, opt

    def backward(model):
        torch.nn.functional.cross_entropy(model(xb), yb).backward()

    for op in ("Average", "Sum"):
        model, params, comp, opt = fresh(op=getattr(hvd, op))
        small = [n for n, p in params.items() if p.numel() < 1024]
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(model(xb), yb),
                                    list(params.values()))
        ref = {n: hvd.allreduce(g, name=f"ref.{op}.{n}", op=getattr(hvd, op))
               for n, g in zip(params, grads)}
        opt.zero_grad()
        backward(model)
        opt.synchronize()
        out[f"{op}_small_equal"] = all(torch.equal(params[n].grad, ref[n]) for n in small)
        out[f"{op}_large_equal"] = any(torch.equal(params[n].grad, ref[n])
                                       for n in params if n not in small)
        with opt.skip_synchronize():
            opt.step()
        small_bytes = 4 * sum(params[n].numel() for n in small)
        out[f"{op}_horovod_bytes"] = [comp.last_stats.horovod_bytes, small_bytes]
        out[f"{op}_compressed"] = [comp.last_stats.compressed_elements,
                                   comp.last_stats.elements]
    out["small"] = small
    for policy in ("propagate", "raise"):
        model, params, comp, opt = fresh(on_nonfinite=policy)
        train(model, opt, 1)  # a finite step: state to keep
        kept = comp.store.to_host()
        params[small[0]].register_hook(lambda g: g * float("nan") if rank == 1 else g)
        opt.zero_grad()
        backward(model)
        if policy == "raise":
            out["raise"] = error_of(opt.synchronize)
            continue
        opt.synchronize()
        out["propagate"] = {
            "nan_tensor_all_nan": bool(torch.isnan(params[small[0]].grad).all()),
            "others_zero": all(not bool(p.grad.any()) for n, p in params.items()
                               if n != small[0]),
            "state_unchanged": same_state(kept, comp.store.to_host()),
            "skipped": comp.state_dict()["skipped"]}
        with opt.skip_synchronize():
            opt.step()


def case_all_small():
    from hvdcomp.comm import get_context
    messages = get_context().stats

    def fresh(**settings):
        torch.manual_seed(0)
        model = make_model(hidden=32)
        comp = hvdcomp.Marsit(seed=1, min_compress_numel=10**6, **settings)  # none compressed
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(),
                                       compression=comp)
        return model, dict(model.named_parameters()), comp, opt

    model, params, comp, opt = fresh()
    sent, entries = [], []
    for step in range(4):
        before = messages.messages
        train(model, opt, 1, first=step)
        sent.append(messages.messages - before)
        entries.append({key: id(e) for key, e in getattr(comp.engine, "summed", {}).items()})
    out["messages_per_step"] = sent
    out["entries_kept"] = len(entries[1]) == len(params) and entries[1] == entries[3]
    out["digest"] = digest(model)
    first = sorted(params)[0]
    for policy in ("propagate", "raise"):
        model, params, comp, opt = fresh(on_nonfinite=policy)
        train(model, opt, 2)  # the entries are kept ones from here on
        params[first].register_hook(lambda g: g * float("nan") if rank == 1 else g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[:32]), ytr[:32]).backward()
        if policy == "raise":
            out["raise"] = error_of(opt.synchronize)
            continue
        opt.synchronize()
        out["propagate"] = {
            "nan_tensor_all_nan": bool(torch.isnan(params[first].grad).all()),
            "others_zero": all(not bool(p.grad.any()) for n, p in params.items() if n != first),
            "skipped": comp.state_dict()["skipped"]}
        with opt.skip_synchronize():
            opt.step()
    out["first"] = first


{"ops": case_ops, "setup": case_setup, "amp": case_amp, "reuse": case_reuse,
 "params": case_params, "sets": case_sets, "set_runtimes": case_set_runtimes,
 "small": case_small,
 "all_small": case_all_small}[CASE]()
report(rank=rank, **out)
