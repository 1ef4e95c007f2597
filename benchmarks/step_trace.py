"""Where a training run's time goes, step by step: the time of every optimizer step of an example's
``train()`` (as benchmarks/convergence.py runs it) and the compress-or-pass decision in force at
each, for several methods one after another in one launch. Rank script; on the emulated cluster
(root), e.g. recipe (a) at 1 Gbit/s:

    benchmarks/cluster.sh up 2 1gbit
    benchmarks/cluster.sh run --per-host 2 --timeout 600 -- .venv/bin/python \\
        benchmarks/step_trace.py --methods none,marsit,none --out /tmp/trace.json -- \\
        --epochs 30 --batch-size 16 --lr 0.1 --momentum 0

Rank 0 prints, per run: the example's timed seconds, the part of them before the first step
ended (hvdcomp's first step: its communicator, the kernels of the step engine), the median step,
and then one line per stretch of steps under one decision (phase, threshold, float16 or not):
its steps, their sum and median, so the decision's probe can be read off against the passing
steps of its hold. ``--out`` keeps every step's time and decision as JSON. The example's own
``train()`` runs unchanged; only the optimizer's ``step`` is wrapped to take the time after it.
"""
import argparse
import json
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from convergence_ranks import init_ranks, load_example  # noqa: E402


def traced(make, stamps, decisions, windows):
    """``hvd.DistributedOptimizer`` (``make``) whose optimizer appends, after each ``step()``, the
    time to ``stamps``, the decision of the compressor's last step to ``decisions`` and, to
    ``windows``, this rank's exchange window of the step before (``Decision.last_window``) and
    the candidates' medians of the last probe (agreed windows: the slowest rank's)."""
    def wrap(optimizer, **kwargs):
        dist = make(optimizer, **kwargs)
        step, compression = dist.step, kwargs.get("compression")

        def timed(_self, *args, **kw):
            result = step(*args, **kw)
            stamps.append(time.perf_counter())
            stats = getattr(compression, "last_stats", None)
            d = stats.decision if stats is not None else {}
            decisions.append([d.get("phase"), str(d.get("threshold")), bool(d.get("half"))]
                             if d else None)
            rule = getattr(compression, "decision", None)  # an instance's (not a class's)
            windows.append(None if not hasattr(rule, "last_window") else {
                "window": rule.last_window, "medians": {
                    str(rule.thresholds[i]): m for i, m in rule.medians.items()}})
            return result
        dist.step = types.MethodType(timed, dist)  # bound: a LR scheduler rewraps it
        return dist
    return wrap


def stretches(steps, decisions):
    """``[(decision, [step seconds])]``: the runs of consecutive steps under one decision."""
    found = []
    for dt, d in zip(steps, decisions):
        if found and found[-1][0] == d:
            found[-1][1].append(dt)
        else:
            found.append((d, [dt]))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default=os.path.join(os.path.dirname(HERE), "examples",
                                                      "train_torch.py"),
                    help="a torch example (train_torch.py, train_charlm.py): its optimizer's "
                         "step() is what is timed")
    ap.add_argument("--methods", required=True, help="comma-separated, run in this order")
    ap.add_argument("--out", default=None, help="JSON of every step (rank 0)")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the example's options")
    args = ap.parse_args()
    mod = load_example(args.example)
    hvd = init_ranks(mod)
    ex_args = mod.parser().parse_args([a for a in args.rest if a != "--"])
    make, found = hvd.DistributedOptimizer, {}
    for method in args.methods.split(","):
        stamps, decisions, windows = [], [], []
        hvd.DistributedOptimizer = traced(make, stamps, decisions, windows)
        try:
            rec = mod.train(ex_args, method, 0, None, verbose=False)
        finally:
            hvd.DistributedOptimizer = make
        if hvd.rank() != 0:
            continue
        s = rec["summary"]
        steps = [b - a for a, b in zip(stamps, stamps[1:])]
        first = s["seconds"] - sum(steps)
        print(f"{method}: {s['seconds']:.2f} s timed, {first:.3f} s to the end of step 1, "
              f"median step {1e3 * statistics.median(steps):.2f} ms, final {s['final']:.4f}",
              flush=True)
        for d, dts in stretches(steps, decisions[1:]):
            print(f"    {d}: {len(dts)} steps, {sum(dts):.3f} s, median "
                  f"{1e3 * statistics.median(dts):.2f} ms", flush=True)
        found.setdefault(method, []).append({"seconds": s["seconds"], "first_s": first,
                                             "steps_s": steps, "decisions": decisions,
                                             "windows": windows,
                                             "final": s["final"]})
    if args.out and hvd.rank() == 0:
        with open(args.out, "w") as fh:
            json.dump(found, fh)


if __name__ == "__main__":
    main()
