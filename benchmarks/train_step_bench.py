"""Rank script: per-step training time of a communication-heavy model, per compressor, in one job.

Launched by ``benchmarks/run_bench.sh`` through ``benchmarks/cluster.sh run`` (one job per link
rate, after ``allreduce_bench.py``); any MPI launch works too:

    mpirun -np 4 --oversubscribe .venv/bin/python benchmarks/train_step_bench.py --steps 3

The model is a real architecture's parameter list: ``torch.nn.TransformerEncoder`` (``--layers``
layers, d_model 512, 8 heads, feed-forward 2048) under a 5000-token embedding and output layer,
4 layers: 17.7M parameters in 51 tensors of very different sizes (biases and norms of 512
elements, matrices of 0.26M to 2.6M). Per rank, a batch of 4 random sequences of 32 tokens: little
compute per parameter, so the step is dominated by the gradient all-reduce, as in large-model
data parallelism on slow links. ``--model mlp``: instead, the 25M-parameter 2-layer MLP of issue
#18 (5000 -> 2500 -> 5000, 4 tensors: two 12.5M matrices and their biases; a batch of 4 random
vectors against random classes); ``--model mlp48``: the 25M MLP of 48 tensors of issue #19 (24
Linear(1024, 1024), ReLU between), whose TensorFlow twin is ``tf_step_bench.py``.

For every method (Horovod fp32/fp16, every hvdcomp compressor) a fresh model (same seed on every
rank) and the stock ``hvd.DistributedOptimizer(SGD(lr=1e-4), named_parameters=...,
compression=C)`` run ``--warmup`` steps, then ``--steps`` timed steps (fewer when a warm-up step
took longer than ``--max-seconds / steps``), each after a barrier; a step's time is the slowest
rank's (zero_grad + forward + backward + step). Also measured once, with no Horovod in the loop:
the forward + backward time alone (``compute``). Rank 0 appends one JSON object per method to
``--out`` (``kind: "train"``): median step seconds, the first (warm-up) step's seconds, compute seconds, parameters, tensors, and
hvdcomp's mean bytes sent per rank per step (Horovod: the nominal ring volume), and for hvdcomp the
median per-phase seconds of its ``last_stats`` (encode / comm / decode, slowest rank) and the rest
of the step. ``train_matrix.sh`` runs it over link rates and models.
"""
import argparse
import time

from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)

import torch
import horovod.torch as hvd

from methods import (add_step_args, make_compression, report_step, step_phases,  # this folder
                     step_record)

VOCAB, D_MODEL, SEQ, BATCH, WIDTH48 = 5000, 512, 32, 4, 1024


class TinyLM(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        layer = torch.nn.TransformerEncoderLayer(D_MODEL, 8, 2048, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens)))


class MLP(torch.nn.Module):
    """The 25M 2-layer MLP: 5000 -> 2500 -> 5000."""

    def __init__(self, width=2500):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(VOCAB, width), torch.nn.ReLU(),
                                        torch.nn.Linear(width, VOCAB))

    def forward(self, x):
        return self.body(x)


class MLP48(torch.nn.Module):
    """The 25M MLP of 48 tensors (issue #19): 24 Linear(1024, 1024) with ReLU between."""

    def __init__(self, layers=24):
        super().__init__()
        mods = []
        for i in range(layers):
            mods.append(torch.nn.Linear(WIDTH48, WIDTH48))
            if i < layers - 1:
                mods.append(torch.nn.ReLU())
        self.body = torch.nn.Sequential(*mods)

    def forward(self, x):
        return self.body(x)


def make_model(args):
    return {"mlp": MLP, "mlp48": MLP48}.get(args.model, lambda: TinyLM(args.layers))()


def make_batch(args, gen):
    """(inputs, targets) of this rank: token sequences (transformer) or vectors (mlp)."""
    if args.model == "mlp":
        return (torch.randn(BATCH, VOCAB, generator=gen),
                torch.randint(0, VOCAB, (BATCH,), generator=gen))
    if args.model == "mlp48":
        return (torch.randn(BATCH, WIDTH48, generator=gen),
                torch.randint(0, WIDTH48, (BATCH,), generator=gen))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def one_step(model, opt, batch):
    opt.zero_grad()
    logits = model(batch[0])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             batch[1].reshape(-1))
    loss.backward()
    opt.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("transformer", "mlp", "mlp48"), default="transformer")
    ap.add_argument("--layers", type=int, default=4)
    add_step_args(ap)
    args = ap.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(rank)
    tokens = make_batch(args, gen)

    torch.manual_seed(0)
    model = make_model(args)
    params = sum(p.numel() for p in model.parameters())
    tensors = sum(1 for _ in model.parameters())
    plain = torch.optim.SGD(model.parameters(), lr=1e-4)
    one_step(model, plain, tokens)
    comm.Barrier()
    t0 = time.perf_counter()
    one_step(model, plain, tokens)
    compute = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    if rank == 0:
        print(f"# train-step bench: {size} ranks, {params / 1e6:.1f}M parameters in {tensors} "
              f"tensors, compute (forward+backward, no Horovod) {compute * 1e3:.0f} ms",
              flush=True)

    out = open(args.out, "a") if (args.out and rank == 0) else None
    for method in args.methods.split(","):
        status, times, sent, phases, first = "ok", [], [], [], None
        try:
            comp = make_compression(method, hvd)
            torch.manual_seed(0)
            model = make_model(args)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                           named_parameters=model.named_parameters(),
                                           compression=comp)
            steps = args.steps
            for i in range(args.warmup + steps):
                comm.Barrier()
                t0 = time.perf_counter()
                one_step(model, opt, tokens)
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if i == 0:
                    first = dt  # the first step of a fresh optimizer (compile, allocation)
                if i == 0 and dt * steps > args.max_seconds:
                    steps = max(1, int(args.max_seconds // dt))
                if i >= args.warmup:
                    times.append(dt)
                    st = getattr(comp, "last_stats", None)
                    if st is not None:
                        sent.append(comm.allreduce(st.bytes_sent, op=MPI.SUM) / size)
                        phases.append(step_phases(comm, comp))
                if i >= args.warmup + steps - 1:
                    break
        except Exception as exc:  # noqa: BLE001 - reported, the other methods still run
            status = f"error: {type(exc).__name__}: {exc}"
        comm.Barrier()
        rec = step_record(
            {"kind": "train", "framework": "torch", "api": "optimizer", "model": args.model,
             "label": args.label, "ranks": size, "hosts": hvd.cross_size(), "method": method,
             "status": status, "params": params, "tensors": tensors, "compute_seconds": compute},
            times, first, sent, phases)
        if rank == 0:
            report_step(out, rec, "train")
    if out:
        out.close()


if __name__ == "__main__":
    main()
