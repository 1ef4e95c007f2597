"""Timing configurations in interleaved rounds beside the compute ceiling: what the regimes
benchmarks share (``regimes.py``: PyTorch; ``regimes_tf.py``: TensorFlow, tf.function and Keras).

A *configuration* (``Timed``) is one way to train the same model: ``ceiling`` (the user's
optimizer alone, no exchange), Horovod's fp32 / fp16, or an hvdcomp method with its defaults.
``measure`` warms configurations up (hvdcomp's until its compress-or-pass decision holds a choice)
and times ``--rounds`` rounds of ``--steps`` steps of each in turn, so slow drifts of a shared
machine hit all alike; ``measure_paired`` does it one configuration at a time beside the ceiling,
for models whose configurations do not fit in memory together; ``write`` prints and appends the
records that ``report.py --regimes`` reads (where a method's record appears more than once, as
the ceiling's after each pair, the last counts).
"""
import gc
import json
import math
import statistics
import time
import traceback

from mpi4py import MPI

from methods import ALL_METHODS


class Timed:
    """One configuration: its method (``ceiling``, ``hvd-fp32``, ``hvd-fp16`` or an hvdcomp
    method), its compressor (None for the ceiling) and its timings. A subclass builds the model
    and optimizer and gives ``one_step(batch)``, one training step; ``drop()`` frees them."""

    def __init__(self, method, comp):
        self.method, self.comp = method, comp
        self.rounds, self.warmup, self.status, self.decided = [], None, "ok", None

    def one_step(self, batch):
        raise NotImplementedError

    def drop(self):
        """Free the model, the optimizer and the compressor (after the configuration's rounds)."""
        self.comp = None

    def deciding(self):
        """Whether its compress-or-pass decision is still probing."""
        d = getattr(self.comp, "decision", None)
        return d is not None and d.phase == "probe"

    def timed_step(self, comm, batch):
        """One step after a barrier: the slowest rank's seconds."""
        comm.Barrier()
        t0 = time.perf_counter()
        self.one_step(batch)
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def measure(args, comm, batch, configs, keep=None):
    """Warm ``configs`` up (those not warmed up before: ``args.warmup`` steps, hvdcomp's until
    its decision holds a choice, at most ``args.max_warmup``) and time ``args.rounds`` rounds of
    ``args.steps`` steps of each in turn (a round's figure: the median step); returns them, the
    ones that raised first (``status``), all but ``keep`` dropped."""
    for c in (c for c in configs if c.warmup is None):
        t0, n = time.perf_counter(), 0
        try:
            while n < args.warmup or (c.deciding() and n < args.max_warmup):
                seconds = c.timed_step(comm, batch)
                n += 1
                if args.trace and comm.rank == 0:
                    d = getattr(c.comp, "decision", None)
                    print(f"  warm-up {c.method} step {n}: {seconds:.2f} s"
                          + (f" [{d.describe()}]" if d is not None else ""), flush=True)
        except Exception as exc:  # noqa: BLE001 - e.g. a method refused under AdamW: reported
            c.status = f"error: {type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()  # on the rank that raised (the others may wait for it)
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
        c.drop()
    gc.collect()
    return failed + configs


def measure_paired(args, comm, batch, methods, make, each):
    """One configuration at a time: the ceiling built once (``make('ceiling')``) and kept, every
    other one built (``make(method)``), measured beside it (``measure`` of the pair) and dropped;
    each gets the ceiling's rounds of its pair as ``paired`` (``write``: its fraction of the
    ceiling from its own pair, round by round). After each pair, ``each([ceiling, config])``
    (the ceiling with all its rounds so far; e.g. ``write``: a long job killed on its way keeps
    what it measured)."""
    ceiling, every = make("ceiling"), []
    others = [m for m in methods if m != "ceiling"]
    if not others:
        each(measure(args, comm, batch, [ceiling]))
    for m in others:
        ceiling.rounds = []
        config = make(m)
        measure(args, comm, batch, [ceiling, config], keep=ceiling)
        config.paired, every = ceiling.rounds, every + ceiling.rounds
        ceiling.rounds = every
        each([ceiling, config])
    ceiling.drop()


def write(args, configs, job):
    """Rank 0: print and append (``args.out``) one record per configuration: ``job`` (the model,
    the ranks, the parameters, Horovod's fp32 allreduce seconds ``allreduce_seconds``...) and its
    own figures: median step ``seconds``, ``rounds``, ``ceiling_seconds`` (the job's ceiling, or
    the one timed beside it: then also ``ceiling_rounds``), ``r``, the warm-up, the decision."""
    failed = [c for c in configs if c.status != "ok"]
    configs = [c for c in configs if c.status == "ok"]
    ceiling = next((statistics.median(c.rounds) for c in configs if c.method == "ceiling"),
                   math.nan)
    name = job["model"]

    def append(rec):
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
    for c in failed:
        print(f"{args.label:>8} {name} {c.method:<13} {c.status}", flush=True)
        append({**job, "label": args.label, "method": c.method, "status": c.status})
    for c in configs:
        d, beside = c.decided, getattr(c, "paired", None)
        own = statistics.median(beside) if beside else ceiling
        rec = {**job, "label": args.label, "status": "ok", "method": c.method,
               "seconds": statistics.median(c.rounds), "rounds": c.rounds,
               "ceiling_seconds": own, **({"ceiling_rounds": beside} if beside else {}),
               "r": job["allreduce_seconds"] / ceiling, "warmup_steps": c.warmup[0],
               "warmup_seconds": c.warmup[1], "decision": d}
        print(f"{args.label:>8} {name} {c.method:<13} {1e3 * rec['seconds']:8.1f} ms/step "
              f"(rounds {', '.join(f'{1e3 * s:.0f}' for s in c.rounds)}; "
              f"{own / rec['seconds']:.2f} of the ceiling{' beside it' if beside else ''}; "
              f"r {rec['r']:.2f})"
              + (f" [{d['describe']}; warm-up {c.warmup[0]} steps; candidates' windows: "
                 + ", ".join(f"{k} {1e3 * m:.0f} ms" for k, m in d["medians"].items()) + "]"
                 if d else ""), flush=True)
        append(rec)


def run(args, comm, batch, make, job):
    """Measure the configurations of ``args.methods`` (each built by ``make(method)``) together
    or, with ``args.sequential``, one at a time beside the ceiling; rank 0 writes their
    records."""
    methods = args.methods.split(",")
    def write_here(configs):
        if comm.rank == 0:
            write(args, configs, job)
    if args.sequential:
        measure_paired(args, comm, batch, methods, make, write_here)
    else:
        write_here(measure(args, comm, batch, [make(m) for m in methods]))


def add_args(ap):
    """The arguments both regimes benchmarks take (besides their models)."""
    ap.add_argument("--methods", default="ceiling," + ",".join(ALL_METHODS))
    ap.add_argument("--batch", type=int, default=8)
    # Horovod's synthetic benchmarks' 224 pixels (regimes.py says why not 64)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-warmup", type=int, default=45)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sequential", action="store_true")
    ap.add_argument("--trace", action="store_true", help="print each warm-up step (rank 0)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="")


def allreduce_seconds(comm, allreduce):
    """Median of 3 timed calls of ``allreduce()`` (Horovod's fp32 allreduce of a tensor of the
    model's size, after one warm-up), the slowest rank's seconds."""
    times = []
    for _ in range(4):
        comm.Barrier()
        t0 = time.perf_counter()
        allreduce()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(times[1:])
