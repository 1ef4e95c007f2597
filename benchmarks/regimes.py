"""Rank script: training throughput on real model shapes at one link rate, every method against
Horovod fp32 / fp16 and the compute ceiling, from one job (issue #31).

    benchmarks/regimes.sh                      # the emulated cluster, every rate and model
    mpirun -np 4 --oversubscribe .venv/bin/python benchmarks/regimes.py --model resnet18

Models, written here (torchvision's wheel does not load beside this CPU torch):
- ``resnet18``: torchvision's ResNet-18 architecture (BasicBlock [2, 2, 2, 2], 1000 classes,
  11.7M parameters in 62 tensors), as Horovod's ``pytorch_synthetic_benchmark.py``: synthetic
  images (``--image`` pixels square, default 64 to keep a CPU step short; the parameter shapes,
  which set the traffic, do not depend on it), batch ``--batch`` (8) per rank, SGD(lr 0.01).
- ``resnet50``: the same with Bottleneck [3, 4, 6, 3] (25.6M parameters in 161 tensors).
- ``gpt``: a GPT-style causal transformer LM (``--layers`` 8, d_model 512, 8 heads, feed-forward
  2048, vocabulary 8192, learned positions, tied output; ~30M parameters in ~100 tensors),
  sequences of ``--seq`` (64) tokens, batch ``--batch``, AdamW(lr 1e-4): the user's optimizer
  (BinSGDM refuses it: reported).

Configurations (``--methods``): ``ceiling`` (the user's optimizer alone, no exchange: every rank
trains on the same shared cores, so this is the step with the gradient exchange removed),
``hvd-fp32`` / ``hvd-fp16`` (Horovod's own compression), and every hvdcomp method with its
defaults (the bare class's settings: compress-or-pass decision 'measure', ``hvdcomp.decision``).
All are built at once (same seed) and warmed up: hvdcomp's until its decision holds a choice
(at most ``--max-warmup`` steps; the steps and seconds it took are reported), the others
``--warmup`` steps. Then ``--rounds`` rounds, each timing ``--steps`` steps of every
configuration in turn (so slow drifts of a shared machine hit all alike); a step is the slowest
rank's seconds after a barrier. ``--sequential``: one configuration at a time, for models whose
configurations do not fit in memory together (gpt with AdamW): the ceiling is built once and
kept, and each other configuration is built, warmed up, timed in rounds interleaved with the
ceiling's, and freed. Each then carries the ceiling timed beside it (``ceiling_rounds``,
``ceiling_seconds``: its fraction of the ceiling is taken from its own pair, round by round), so a
drift of the machine between configurations, which one shared ceiling taken first does not see
(gpt's 8-second CPU steps drifted by 1.2-1.8x), cancels; the ratios between configurations are
ratios of those fractions. Also measured: Horovod's fp32 allreduce of a tensor of the model's size (median of 3),
so ``r = allreduce / ceiling step``. Rank 0 prints and appends one JSON object per configuration
to ``--out``.
"""
import argparse
import gc
import json
import math
import statistics
import time

from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)

import torch
import horovod.torch as hvd

from methods import ALL_METHODS, make_compression  # this folder

nn = torch.nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.down = _shortcut(cin, width, stride)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.down(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.down = _shortcut(cin, width * 4, stride)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(self.bn3(self.conv3(out)) + self.down(x))


def _shortcut(cin, cout, stride):
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """torchvision's ResNet: 7x7 stem, max pool, four stages, global pool, fc."""

    def __init__(self, block, counts, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, n in enumerate(counts):
            width = 64 << i
            for j in range(n):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(
            self.stages(self.stem(x)), 1), 1))


class GPT(nn.Module):
    """A GPT-style causal LM: token + position embeddings, pre-norm blocks, tied output."""

    def __init__(self, layers, vocab=8192, d=512, heads=8, ff=2048, seq=64):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.mask = nn.Transformer.generate_square_subsequent_mask(seq)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[:tokens.shape[1]]
        h = self.norm(self.body(h, mask=self.mask, is_causal=True))
        return h @ self.embed.weight.t()


def build(args):
    torch.manual_seed(0)
    if args.model == "gpt":
        return GPT(args.layers, seq=args.seq)
    return ResNet(*{"resnet18": (BasicBlock, [2, 2, 2, 2]),
                    "resnet50": (Bottleneck, [3, 4, 6, 3])}[args.model])


def make_batch(args, gen):
    if args.model == "gpt":
        tokens = torch.randint(0, 8192, (args.batch, args.seq + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]
    return (torch.randn(args.batch, 3, args.image, args.image, generator=gen),
            torch.randint(0, 1000, (args.batch,), generator=gen))


def user_optimizer(args, model):
    if args.model == "gpt":
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.01)  # as Horovod's synthetic benchmark


def one_step(model, opt, batch):
    opt.zero_grad()
    out = model(batch[0])
    nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), batch[1].reshape(-1)).backward()
    opt.step()


class Config:
    """One configuration's model, optimizer and compressor, and its timings."""

    def __init__(self, args, method):
        self.method, self.model = method, build(args)
        opt = user_optimizer(args, self.model)
        self.comp = None
        if method != "ceiling":
            self.comp = make_compression(method, hvd)
            opt = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters(),
                                           compression=self.comp)
        self.opt, self.rounds, self.warmup, self.status = opt, [], None, "ok"

    def deciding(self):
        d = getattr(self.comp, "decision", None)
        return d is not None and d.phase == "probe"

    def timed_step(self, comm, batch):
        comm.Barrier()
        t0 = time.perf_counter()
        one_step(self.model, self.opt, batch)
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def allreduce_seconds(params, comm):
    """Median of 3 timed Horovod fp32 allreduces of ``params`` elements (after one warm-up)."""
    x, times = torch.ones(params), []
    for i in range(4):
        comm.Barrier()
        t0 = time.perf_counter()
        hvd.allreduce(x, name="regimes.probe", op=hvd.Sum)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("resnet18", "resnet50", "gpt"), default="resnet18")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--methods", default="ceiling," + ",".join(ALL_METHODS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-warmup", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sequential", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD.Dup()
    batch = make_batch(args, torch.Generator().manual_seed(hvd.rank()))
    model = build(args)
    params = sum(p.numel() for p in model.parameters())
    tensors = sum(1 for _ in model.parameters())
    wire = allreduce_seconds(params, comm)
    del model
    methods = args.methods.split(",")
    done = (measure_paired(args, comm, batch, methods) if args.sequential
            else measure(args, comm, batch, [Config(args, m) for m in methods]))
    if hvd.rank() == 0:
        write(args, done, params, tensors, wire)


def measure(args, comm, batch, configs, keep=None):
    """Warm ``configs`` up (those not warmed up before) and time their rounds (see the module
    docstring); returns them with their figures, their models and optimizers dropped (but
    ``keep``'s)."""
    for c in (c for c in configs if c.warmup is None):
        t0, n = time.perf_counter(), 0
        try:
            while n < args.warmup or (c.deciding() and n < args.max_warmup):
                c.timed_step(comm, batch)
                n += 1
        except Exception as exc:  # noqa: BLE001 - e.g. a method refused under AdamW: reported
            c.status = f"error: {type(exc).__name__}: {exc}"[:300]
        c.warmup = (n, time.perf_counter() - t0)
    configs, failed = [c for c in configs if c.status == "ok"], [
        c for c in configs if c.status != "ok"]
    for _ in range(args.rounds):
        for c in configs:
            c.rounds.append(statistics.median(c.timed_step(comm, batch)
                                              for _ in range(args.steps)))
    for c in (c for c in configs + failed if c is not keep):
        d = getattr(c.comp, "decision", None)
        c.decided = None if d is None else {**d.as_dict(), "describe": d.describe()}
        c.model = c.opt = c.comp = None
    gc.collect()
    return failed + configs


def measure_paired(args, comm, batch, methods):
    """``--sequential``: the ceiling built once, every other configuration measured beside it
    (``measure`` of the pair); each gets the ceiling's rounds of its pair as ``paired``. Returns
    the ceiling (all its rounds) and the others."""
    ceiling, done, every = Config(args, "ceiling"), [], []
    others = [m for m in methods if m != "ceiling"]
    if not others:
        return measure(args, comm, batch, [ceiling])
    for m in others:
        ceiling.rounds = []
        config = Config(args, m)
        measure(args, comm, batch, [ceiling, config], keep=ceiling)
        config.paired, every = ceiling.rounds, every + ceiling.rounds
        done.append(config)
    ceiling.rounds, ceiling.decided = every, None
    ceiling.model = ceiling.opt = None
    return [ceiling] + done


def write(args, configs, params, tensors, wire):
    """Rank 0: print and append (``--out``) one record per configuration."""
    failed = [c for c in configs if c.status != "ok"]
    configs = [c for c in configs if c.status == "ok"]
    ceiling = next((statistics.median(c.rounds) for c in configs if c.method == "ceiling"),
                   math.nan)
    for c in failed:
        print(f"{args.label:>8} {args.model} {c.method:<13} {c.status}", flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps({"model": args.model, "label": args.label,
                                     "method": c.method, "status": c.status}) + "\n")
    for c in configs:
        d, beside = c.decided, getattr(c, "paired", None)
        own = statistics.median(beside) if beside else ceiling
        rec = {"model": args.model, "label": args.label, "status": "ok", "ranks": hvd.size(),
               "hosts": hvd.cross_size(), "params": params, "tensors": tensors,
               "batch": args.batch, "method": c.method, "seconds": statistics.median(c.rounds),
               "rounds": c.rounds, "allreduce_seconds": wire, "ceiling_seconds": own,
               **({"ceiling_rounds": beside} if beside else {}),
               "r": wire / ceiling, "warmup_steps": c.warmup[0], "warmup_seconds": c.warmup[1],
               "decision": d}
        print(f"{args.label:>8} {args.model} {c.method:<13} {1e3 * rec['seconds']:8.1f} ms/step "
              f"(rounds {', '.join(f'{1e3 * s:.0f}' for s in c.rounds)}; "
              f"{own / rec['seconds']:.2f} of the ceiling{' beside it' if beside else ''}; "
              f"r {rec['r']:.2f})"
              + (f" [{d['describe']}; warm-up {c.warmup[0]} steps]" if d else ""), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
