"""Train a tiny character-level transformer language model on Python's own documentation text
(``pydoc_data.topics``, which ships with CPython: no download) with Horovod and hvdcomp
compression. Launch with several ranks, e.g.

    horovodrun -np 4 python examples/train_charlm.py --compression marsit
    mpirun -np 4 python examples/train_charlm.py --compression none

The only hvdcomp-specific line is the ``compression=`` argument of hvd.DistributedOptimizer.
Prints progress (validation loss in nats per character, bytes each rank sent per step) and, at
the end, a summary including whether all ranks hold bit-identical weights. ``--json FILE`` writes
the curve and the summary as JSON (rank 0).

Data: the documentation topics joined in sorted order (``--text stdlib``: the source of a few
standard-library modules); the first 90% is training text (each rank draws its own random
windows), the last 10% validation (a fixed set of windows, the same on every rank). Model: causal
transformer, 2 layers (``--layers``), d_model 64, 4 heads, context 64 (117k parameters).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
import horovod.torch as hvd

from hvdcomp import registry
import recipes  # examples/recipes.py: the learning rates
from train_torch import bytes_per_step, say, weights_digest  # examples/ is sys.path[0]

# Horovod's own compressions, then every hvdcomp preset of hvdcomp/registry.py (constructor
# arguments documented in docs/options.md).
COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    **{name: (lambda name=name: registry.build(name)) for name in registry.PRESETS},
}


def _optimizer(rates):
    """'adam', 'sgd' or 'sgdm' (SGD with momentum 0.9) for a recipes.Rates."""
    if rates.optimizer == "adam":
        return "adam"
    return "sgdm" if rates.momentum else "sgd"


# Per-method (optimizer, learning rate) for this task ("charlm" in examples/recipes.py), chosen
# once by the equal-effort sweep in benchmarks/convergence_tuning.md and used for every seed.
# BinSGDM is itself the optimizer (momentum + sign votes), so its inner optimizer is plain SGD.
DEFAULTS = {name: (_optimizer(recipes.rates(name, "charlm")), recipes.rates(name, "charlm").lr)
            for name in COMPRESSIONS}


# --text stdlib: the source of these standard-library modules, joined in this order (~0.5 MB)
STDLIB_MODULES = ("argparse", "inspect", "typing", "dataclasses", "textwrap", "functools",
                  "enum", "pathlib")


def load_text(source="pydoc", val_fraction=0.1):
    """(train ids, validation ids, vocabulary) of ``source``, split by position: 'pydoc'
    (pydoc_data's documentation topics, joined in sorted order) or 'stdlib' (the Python source
    of ``STDLIB_MODULES``; it follows the Python version)."""
    if source == "stdlib":
        import importlib
        import inspect
        text = "".join(inspect.getsource(importlib.import_module(m)) for m in STDLIB_MODULES)
    else:
        from pydoc_data.topics import topics
        text = "".join(topics[k] for k in sorted(topics))
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
    cut = int(len(ids) * (1 - val_fraction))
    return ids[:cut], ids[cut:], vocab


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CharLM(torch.nn.Module):
    def __init__(self, vocab_size, d=64, heads=4, layers=2, context=64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, d)
        self.pos = torch.nn.Parameter(torch.zeros(context, d))
        self.blocks = torch.nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab_size)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))


def windows(ids, starts, context):
    """Inputs and next-character targets for windows beginning at ``starts``."""
    rows = torch.stack([ids[s:s + context + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compression", default="marsit", choices=sorted(COMPRESSIONS))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16, help="windows per rank per step")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks")
    ap.add_argument("--text", choices=("pydoc", "stdlib"), default="pydoc",
                    help="pydoc: Python's documentation topics; stdlib: the source of a few "
                         "standard-library modules (STDLIB_MODULES)")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's")
    ap.add_argument("--lr", type=float, default=None, help="default: per method (DEFAULTS)")
    ap.add_argument("--optimizer", choices=("adam", "adamw", "sgd", "sgdm"), default=None,
                    help="default: per method (DEFAULTS)")
    ap.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                    help="learning rate over the run: constant, or cosine decay to 0")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="a linear learning-rate warm-up over the first N steps")
    ap.add_argument("--seed", type=int, default=0, help="model init and data order")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="write the curve and summary as JSON here (rank 0)")
    return ap


def train(args, method, seed, lr=None, optimizer=None, verbose=True):
    """One training run on the initialised Horovod world; returns {"summary", "curve"} (the
    same on every rank, except that only rank 0 prints)."""
    torch.manual_seed(seed)
    train_ids, val, vocab = load_text(getattr(args, "text", "pydoc"))
    val_starts = torch.linspace(0, len(val) - args.context - 2, 128).long()
    xval, yval = windows(val, val_starts, args.context)

    model = CharLM(len(vocab), layers=getattr(args, "layers", 2), context=args.context)
    numel = sum(p.numel() for p in model.parameters())
    built = time.perf_counter()
    compression = COMPRESSIONS[method]()
    setup_seconds = time.perf_counter() - built  # the compressor's construction
    # the optimizer and rate: this call's, else the command line's, else the method's default
    opt_name = optimizer or args.optimizer or DEFAULTS[method][0]
    lr = next(x for x in (lr, args.lr, DEFAULTS[method][1]) if x is not None)
    if opt_name in ("adam", "adamw"):  # adamw: decoupled weight decay, 0.01 by default
        opt = (torch.optim.Adam(model.parameters(), lr=lr) if opt_name == "adam"
               else torch.optim.AdamW(model.parameters(), lr=lr,
                                      weight_decay=getattr(args, "weight_decay", 0.01)))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9 if opt_name == "sgdm" else 0.0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    warmup = getattr(args, "warmup_steps", 0)
    cosine = getattr(args, "schedule", "constant") == "cosine"

    def factor(step):  # of the learning rate at step (0-based): warm-up, then constant or cosine
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    schedule = (torch.optim.lr_scheduler.LambdaLR(opt, factor) if warmup or cosine else None)

    def evaluate():
        model.eval()
        with torch.no_grad():
            out = F.cross_entropy(model(xval).reshape(-1, len(vocab)), yval.reshape(-1)).item()
        model.train()
        return out

    gen = torch.Generator().manual_seed(seed * 1000 + hvd.rank())  # each rank its own data
    curve = [{"step": 0, "val_loss": evaluate(), "train_loss": None, "seconds": 0.0}]
    t0, running = time.perf_counter(), []
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(train_ids) - args.context - 1, (args.batch_size,),
                               generator=gen)
        x, y = windows(train_ids, starts, args.context)
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        running.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            trained = time.perf_counter() - t0  # the seconds to this step, before evaluating
            sent, kind = bytes_per_step(compression, method, numel, hvd.size())
            curve.append({"step": step, "val_loss": evaluate(), "seconds": trained,
                          "train_loss": sum(running) / len(running), "bytes_per_step": sent})
            running = []
            if verbose and hvd.rank() == 0:
                v = curve[-1]["val_loss"]
                say(f"step {step}/{args.steps} train loss {curve[-1]['train_loss']:.3f} val loss "
                    f"{v:.4f} nats/char ({v / math.log(2):.3f} bits) | {sent / 1e3:.1f} "
                    f"kB/step/rank sent ({kind})")

    seconds = time.perf_counter() - t0
    digests = hvd.allgather_object(weights_digest(model))
    sent, kind = bytes_per_step(compression, method, numel, hvd.size())
    summary = {"task": "charlm", "compression": method, "seed": seed, "ranks": hvd.size(),
               "steps": args.steps, "optimizer": opt_name, "lr": lr,
               "batch_size": args.batch_size, "context": args.context, "parameters": numel,
               "metric": "val_loss", "final": curve[-1]["val_loss"], "bytes_per_step": sent,
               "bytes_kind": kind,
               "fp32_ring_bytes_per_step": 2 * (hvd.size() - 1) / hvd.size() * numel * 4,
               "seconds": seconds, "setup_seconds": setup_seconds, "digests": digests,
               "identical": len(set(digests)) == 1}
    return {"summary": summary, "curve": curve}


def main():
    args = parser().parse_args()
    hvd.init()
    torch.set_num_threads(1)
    run = train(args, args.compression, args.seed, args.lr, args.optimizer)
    s = run["summary"]
    if hvd.rank() == 0:
        say(f"done: {s['ranks']} ranks, {s['steps']} steps in {s['seconds']:.1f}s, "
            f"compression={s['compression']} ({s['optimizer']} lr {s['lr']:g}), final val loss "
            f"{s['final']:.4f} nats/char, {s['bytes_per_step'] / 1e3:.1f} kB/step/rank sent "
            f"({s['bytes_kind']}; fp32 ring {s['fp32_ring_bytes_per_step'] / 1e3:.1f} kB), "
            f"weights identical on all ranks: {s['identical']}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(run, fh, indent=1)
        if not s["identical"]:
            raise SystemExit("ranks disagree about the weights")


if __name__ == "__main__":
    main()
