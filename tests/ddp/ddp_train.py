"""A DDP rank script (launched by torchrun, Gloo, no MPI rank): the digits MLP trained through
``register_comm_hook(hvdcomp.ddp.State(...), hvdcomp.ddp.hook)``; the cases are the functions
of ``CASES`` (``main``: how to call it)."""
import gc
import hashlib
import io
import json
import os
import pickle
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.append(os.path.join(HERE, ".."))
from digits import load_digits  # noqa: E402
import expect  # noqa: E402  (tests/expect.py)
from models import WithUnused  # noqa: E402  (tests/models.py)

import hvdcomp  # noqa: E402
import hvdcomp.ddp  # noqa: E402

torch.set_num_threads(1)
METHODS = {name.lower(): cls for name, cls in hvdcomp.registry.METHODS.items()}


def data():
    pixels, labels = load_digits()
    x = torch.tensor(pixels / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(x))
    return (x[perm[:cut]], y[perm[:cut]]), (x[perm[cut:]], y[perm[cut:]])


def model_and_optimizer(optimizer, method):
    """The MLP in DDP, and AdamW (lr 3e-3) or SGD at the method's rates of the Horovod tests
    (tests/expect.py: "digits-test", else the example's "digits")."""
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1)
    opt = (torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.01) if optimizer == "adamw"
           else torch.optim.SGD(ddp.parameters(), *rates(method)))
    return ddp, opt


def rates(method):
    """(lr, momentum) of ``method`` for the tests' digits runs."""
    method = method.partition("#")[0]
    return expect.lr_momentum(method, "digits-test", fallback="digits")


def batch(x, y, step, rank, size=32):
    g = torch.Generator().manual_seed(10007 * step + rank)
    idx = torch.randint(0, len(x), (size,), generator=g)
    return x[idx], y[idx]


def digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def identical(model):
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, digest(model))
    return len(set(rows)) == 1


def make_state(method, optimizer=None, **kwargs):
    """The hook's state for ``method`` (``optimizer``: the ``State``'s): its class's lowercase
    name, then optionally ``#seed`` (``marsit#1``); 'none': no hook."""
    name, _, seed = method.partition("#")
    if name == "none":
        return None
    return hvdcomp.ddp.State(METHODS[name](**({"seed": int(seed)} if seed else {}), **kwargs),
                             optimizer=optimizer)


def run(ddp, opt, state, x, y, steps, first=0):
    if state is not None:
        ddp.register_comm_hook(state, hvdcomp.ddp.hook)
    rank = dist.get_rank()
    for step in range(first, steps):
        xb, yb = batch(x, y, step, rank)
        opt.zero_grad()
        F.cross_entropy(ddp(xb), yb).backward()
        opt.step()


def evaluate(ddp, x, y):
    with torch.no_grad():
        out = ddp.module(x)
        return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def train(method, steps, optimizer, data_):
    """Train ``steps`` steps: eval loss and accuracy, bit-identity, compressed elements."""
    (x, y), (xt, yt) = data_
    ddp, opt = model_and_optimizer(optimizer, method)
    state = make_state(method)
    run(ddp, opt, state, x, y, steps)
    result = dict(zip(("loss", "accuracy"), evaluate(ddp, xt, yt)), identical=identical(ddp))
    if state is not None:
        result["compressed"] = int(state.runtime.engine.total_stats.compressed_elements)
        result["iter"] = state.iter
    return result


def resume(method, steps, optimizer, data_, follow=False):
    """A checkpoint at half the steps (model, optimizer, hook state through torch.save and
    torch.load(weights_only=True)) continued in fresh objects: bit-identical to the run that
    went straight through; the state also survives pickle. ``follow``: the resumed hook is
    given the optimizer (``State(optimizer=...)``), as a resume under Adam must."""
    (x, y), _ = data_
    ddp, opt = model_and_optimizer(optimizer, method)
    run(ddp, opt, make_state(method), x, y, steps)
    straight = [p.detach().clone() for p in ddp.parameters()]
    ddp, opt = model_and_optimizer(optimizer, method)
    state = make_state(method)
    run(ddp, opt, state, x, y, steps // 2)
    saved = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(),
                "hook": state.state_dict() if state else {}}, saved)
    unpickled = pickle.loads(pickle.dumps(state))
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)
    ddp, opt = model_and_optimizer(optimizer, method)
    ddp.module.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["opt"])
    state = make_state(method, **({"optimizer": opt} if follow else {}))
    if state is not None:
        state.load_state_dict(loaded["hook"])
    run(ddp, opt, state, x, y, steps, first=steps // 2)
    return {"resumed_identical": all(torch.equal(a, b.detach())
                                     for a, b in zip(straight, ddp.parameters())),
            "unpickled_iter": getattr(unpickled, "iter", None),
            "iter": getattr(state, "iter", None), "identical": identical(ddp)}


def nosync(method, steps, optimizer, data_):
    """Two half batches, the first under ``no_sync``, each loss halved: the hook runs once (the
    state's iteration advances by one) and reduces the accumulated gradient to what one whole
    batch gives (relative L2 distance)."""
    (x, y), _ = data_
    rank = dist.get_rank()
    reduced = []
    for split in (False, True):
        ddp, opt = model_and_optimizer(optimizer, method)
        state = make_state(method)
        run(ddp, opt, state, x, y, 3)  # past the hook's first iterations
        xb, yb = batch(x, y, 99, rank)
        opt.zero_grad()
        before = state.iter
        if split:
            with ddp.no_sync():
                (F.cross_entropy(ddp(xb[:16]), yb[:16]) / 2).backward()
            (F.cross_entropy(ddp(xb[16:]), yb[16:]) / 2).backward()
        else:
            F.cross_entropy(ddp(xb), yb).backward()
        reduced.append(torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]))
        hook_iterations = state.iter - before
    distance = float((reduced[1] - reduced[0]).norm() / reduced[0].norm())
    return {"distance": distance, "hook_iterations": hook_iterations}


def mismatch(method, steps, optimizer, data_):
    """Rank r sets seed r: every rank raises the same hvdcomp error, none hangs."""
    (x, y), _ = data_
    ddp, opt = model_and_optimizer(optimizer, method)
    state = make_state(method, seed=dist.get_rank())
    try:
        run(ddp, opt, state, x, y, 4)
        raised = None
    except hvdcomp.HvdcompError as exc:
        raised = type(exc).__name__
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, raised)
    return {"raised_on": rows}


def passthrough(method, steps, optimizer, data_):
    """With ``decision='pass'`` the hook hands every bucket to torch.distributed's all-reduce as
    DDP's own hook does: the parameters equal DDP's without a hook, bit for bit."""
    (x, y), _ = data_
    trained = []
    for state in (None, hvdcomp.ddp.State(METHODS[method](decision="pass"))):
        ddp, opt = model_and_optimizer(optimizer, "none")
        run(ddp, opt, state, x, y, steps)
        trained.append([p.detach().clone() for p in ddp.parameters()])
    return {"equal": all(torch.equal(a, b) for a, b in zip(*trained)),
            "compressed": int(state.runtime.engine.total_stats.compressed_elements)}


def amp(method, steps, optimizer, data_):
    """A ``torch.amp.GradScaler`` whose scale changes (2**10, then 2**5 from half the steps):
    the hook reduces the unscaled gradients (hvdcomp.loss_scale), so the run equals the
    unscaled one bit for bit."""
    (x, y), _ = data_
    rank = dist.get_rank()
    trained = []
    for scaled in (False, True):
        ddp, opt = model_and_optimizer(optimizer, method)
        ddp.register_comm_hook(make_state(method), hvdcomp.ddp.hook)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, enabled=scaled)
        for step in range(steps):
            xb, yb = batch(x, y, step, rank)
            opt.zero_grad()
            scaler.scale(F.cross_entropy(ddp(xb), yb)).backward()
            scaler.step(opt)
            scaler.update(2.0 ** 5 if step == steps // 2 else None)
        trained.append([p.detach().clone() for p in ddp.parameters()])
    return {"equal": all(torch.equal(a, b) for a, b in zip(*trained))}


def graphs(method, steps, optimizer, data_):
    """DDP's ``static_graph=True``, and ``find_unused_parameters=True`` with a layer no step
    uses, each through the hook for ``steps`` steps: the eval loss before and after, the hook's
    iterations, compressed elements, bit-identity, and how far the unused layer moved."""
    (x, y), (xt, yt) = data_
    out = {}
    for variant in ("static", "unused"):
        ddp, opt = model_and_optimizer(optimizer, method)
        net = ddp.module if variant == "static" else WithUnused(ddp.module, features=64)
        ddp = torch.nn.parallel.DistributedDataParallel(
            net, bucket_cap_mb=0.1, static_graph=variant == "static",
            find_unused_parameters=variant == "unused")
        opt = type(opt)(ddp.parameters(), **{k: opt.defaults[k] for k in ("lr", "momentum")
                                             if k in opt.defaults})
        before = evaluate(ddp, xt, yt)[0]
        unused = list(net.unused.parameters()) if variant == "unused" else []
        initial = [p.detach().clone() for p in unused]
        state = make_state(method)
        run(ddp, opt, state, x, y, steps)
        moved = max((float((p.detach() - u).abs().max()) for p, u in zip(unused, initial)),
                    default=0.0)
        out[variant] = {"before": before, "after": evaluate(ddp, xt, yt)[0],
                        "iter": state.iter, "identical": identical(ddp), "unused_moved": moved,
                        "compressed": int(state.runtime.engine.total_stats.compressed_elements)}
    return out


CLIP = 0.05  # a clip by norm that bites in every step of the digits MLP
COMPRESSED = 1024  # the methods' default min_compress_numel: smaller tensors are summed exactly


def clip(method, steps, optimizer, data_):
    """The transformer recipe on the MLP: the user's AdamW (lr 3e-3, weight decay 0.01) with
    ``clip_grad_norm_(max_norm=CLIP)`` between ``backward()`` and ``step()``, through
    ``method``'s hook and without a hook ('none', run once per launch): each run's eval loss,
    the largest change of a weight in one step over the learning rate (Adam's update stays near
    1), the share of steps the clip bit, and per step whether AdamW's first moment after its
    step is the gradient it stepped, for every tensor the method compresses (hvdcomp's mean
    momentum, clipped: what it follows)."""
    (x, y), (xt, yt) = data_
    if "none" not in _CLIPPED:
        _CLIPPED["none"] = clipped_run("none", steps, x, y, xt, yt)
    return {"none": _CLIPPED["none"], method: clipped_run(method, steps, x, y, xt, yt)}


_CLIPPED = {}


def clipped_run(method, steps, x, y, xt, yt):
    rank = dist.get_rank()
    ddp, opt = model_and_optimizer("adamw", method)
    state = make_state(method)
    if state is not None:
        ddp.register_comm_hook(state, hvdcomp.ddp.hook)
    largest, bit, followed = 0.0, 0, []
    for step in range(steps):
        xb, yb = batch(x, y, step, rank)
        opt.zero_grad()
        F.cross_entropy(ddp(xb), yb).backward()
        bit += float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), CLIP)) > CLIP
        old = [p.detach().clone() for p in ddp.parameters()]
        opt.step()
        largest = max(largest, max(float((p.detach() - o).abs().max())
                                   for p, o in zip(ddp.parameters(), old)))
        followed.append(all(torch.equal(opt.state[p]["exp_avg"], p.grad)
                            for p in ddp.parameters() if p.numel() >= COMPRESSED))
    return {"loss": evaluate(ddp, xt, yt)[0], "step_over_lr": largest / 3e-3,
            "clipped": bit / steps, "followed": followed, "identical": identical(ddp)}


CASES = {"amp": amp, "train": train, "passthrough": passthrough, "resume": resume,
         "resume-adamw": lambda m, s, o, d: resume(m, s, "adamw", d, follow=True),
         "nosync": nosync, "mismatch": mismatch, "graphs": graphs, "clip": clip}


def main():
    """``ddp_train.py [--adamw] CASE=METHOD[#SEED][@STEPS],... ...``: each case for each of its
    methods (STEPS: 60 by default), in one process group; rank 0 prints one ``RESULT {json}``
    line per pair."""
    args = sys.argv[1:]
    optimizer = "adamw" if "--adamw" in args else "sgd"
    dist.init_process_group("gloo")
    data_ = data()
    for spec in (a for a in args if "=" in a):
        case, methods = spec.split("=")
        for item in methods.split(","):
            method, _, steps = item.partition("@")
            result = {"case": case, "method": method, "size": dist.get_world_size(),
                      **CASES[case](method, int(steps or 60), optimizer, data_)}
            if dist.get_rank() == 0:
                print("RESULT " + json.dumps(result), flush=True)
    # A case that raised inside DDP's backward (mismatch) can leave Gloo's worker threads
    # holding tensors: they are released here, while Python is alive (Gloo's barrier waits for
    # every work in flight), and the process ends without Python's finalization, in which such
    # a thread aborts the process (seen once in 5 launches) after every result was printed.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
