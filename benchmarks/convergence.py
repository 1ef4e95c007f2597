"""Convergence benchmark: every example x every compressor x several seeds, on real ranks.

    python benchmarks/convergence.py                # full: 2 tasks x 13 settings x 3 seeds, 4 ranks
    python benchmarks/convergence.py --smoke        # seconds-scale version used by the test suite
    python benchmarks/convergence.py --lr-scales 0.5,1,2 --seeds 1   # the equal-effort lr sweep

Each task is one ``horovodrun -np N`` launch (under a timeout) of benchmarks/convergence_ranks.py,
which calls the example's own ``train()`` once per (method, seed): the same code as
``python examples/<script> --compression M --seed S``, without paying the launch for every run. Tasks: ``digits`` (examples/train_torch.py, test accuracy, higher is better) and
``charlm`` (examples/train_charlm.py, validation loss in nats/char, lower is better). Writes
``<out>/{table.md, table.csv, curves.png, summary.json, raw/*.json, logs/*.txt}`` and prints the
table. Per (task, method): final metric mean and sample standard deviation over seeds, the gap to
the uncompressed baseline (``none``: percentage points of accuracy, or percent of loss), whether it
meets the target (1 pp / 2%), bytes sent per step per rank (measured by hvdcomp for its methods,
computed as the ring all-reduce equivalent for Horovod's none/fp16), and the first evaluated step
at which the seed-mean curve reaches the baseline's final seed-mean quality.

Settings: Horovod's ``none`` and ``fp16``, then every preset of hvdcomp/registry.py but those
in examples/recipes.py's ``NOT_BENCHMARKED`` (so a method added there is run here too).
Hyperparameters are the examples' per-method DEFAULTS, their "digits" and "charlm" rates in
examples/recipes.py (see
benchmarks/convergence_tuning.md); ``--lr-scales`` multiplies each method's default learning
rate (a sweep: one row per scale).
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from hvdcomp import registry  # noqa: E402
import recipes  # noqa: E402

CLUSTER = os.path.join(ROOT, "benchmarks", "cluster.sh")

METHODS = ["none", "fp16"] + [name for name in registry.PRESETS
                              if name not in recipes.NOT_BENCHMARKED]
# script, metric key, higher-is-better, run-length arguments (full, smoke), target gap
TASKS = {
    "digits": {"script": "examples/train_torch.py", "metric": "test_acc", "higher": True,
               "args": ["--epochs", "40"], "smoke": ["--epochs", "2"], "target": 1.0,
               "unit": "pp", "ylim": (0.85, 1.0)},
    "charlm": {"script": "examples/train_charlm.py", "metric": "val_loss", "higher": False,
               "args": ["--steps", "200", "--eval-every", "20"],
               # smoke: 80 steps, since under the user's Adam the first 10 are a dense warm-up
               "smoke": ["--steps", "80", "--eval-every", "40"], "target": 2.0, "unit": "%",
               "ylim": (1.6, 3.0)},
}
# Issue 30's time-to-accuracy recipes: a user's recipe, the same for every method (nothing but
# compression= changes: no per-method rate), so each method's default is measured as a user meets
# it. ``--tasks recipes`` runs them all; ``--link-rates`` adds the step time on the emulated cluster.
RECIPES = {
    "sgd-mlp": {"script": "examples/train_torch.py", "metric": "test_acc", "higher": True,
                "recipe": "(a) digits MLP, plain SGD lr 0.1 (no momentum), batch 16, 30 epochs",
                "args": ["--epochs", "30", "--batch-size", "16", "--lr", "0.1",
                         "--momentum", "0"],
                "smoke": ["--epochs", "1", "--batch-size", "16", "--lr", "0.1", "--momentum", "0"],
                "target": 1.0, "unit": "pp", "ylim": (0.85, 1.0)},
    "cnn-cosine": {"script": "examples/train_torch.py", "metric": "test_acc", "higher": True,
                   "recipe": "(b) digits CNN, SGD lr 0.05 momentum 0.9, cosine to 0, batch 32, "
                             "30 epochs",
                   "args": ["--model", "cnn", "--epochs", "30", "--lr", "0.05", "--momentum",
                            "0.9", "--schedule", "cosine"],
                   "smoke": ["--model", "cnn", "--epochs", "1", "--lr", "0.05", "--momentum",
                             "0.9", "--schedule", "cosine"],
                   "target": 1.0, "unit": "pp", "ylim": (0.85, 1.0)},
    "charlm-adamw": {"script": "examples/train_charlm.py", "metric": "val_loss", "higher": False,
                     "recipe": "(c) char transformer, AdamW lr 3e-3 weight decay 0.01, 30 warm-up "
                               "steps then cosine to 0, 300 steps",
                     "args": ["--optimizer", "adamw", "--lr", "3e-3", "--warmup-steps", "30",
                              "--schedule", "cosine", "--steps", "300", "--eval-every", "25"],
                     "smoke": ["--optimizer", "adamw", "--lr", "3e-3", "--warmup-steps", "5",
                               "--steps", "20", "--eval-every", "10"],
                     "target": 2.0, "unit": "%", "ylim": (1.6, 3.0)},
    "keras-adam": {"script": "examples/train_tf.py", "metric": "test_acc", "higher": True,
                   "recipe": "(d) TensorFlow Keras model.fit of the digits MLP, Adam lr 1e-3, "
                             "batch 32, 20 epochs",
                   "args": ["--mode", "keras", "--optimizer", "adam", "--lr", "1e-3",
                            "--epochs", "20"],
                   "smoke": ["--mode", "keras", "--optimizer", "adam", "--lr", "1e-3",
                             "--epochs", "1"],
                   "target": 1.0, "unit": "pp", "ylim": (0.85, 1.0)},
    # (e): a second AdamW recipe, for checking only (no setting is chosen by it): another
    # text, depth, learning rate and weight decay than (c)
    "charlm-stdlib-adamw": {
        "script": "examples/train_charlm.py", "metric": "val_loss", "higher": False,
        "recipe": "(e) char transformer, 3 layers, on standard-library source, AdamW lr 2e-3 "
                  "weight decay 0.1, 20 warm-up steps then cosine to 0, 300 steps",
        "args": ["--text", "stdlib", "--layers", "3", "--optimizer", "adamw", "--lr", "2e-3",
                 "--weight-decay", "0.1", "--warmup-steps", "20", "--schedule", "cosine",
                 "--steps", "300", "--eval-every", "25"],
        "smoke": ["--text", "stdlib", "--layers", "3", "--optimizer", "adamw", "--lr", "2e-3",
                  "--weight-decay", "0.1", "--warmup-steps", "5", "--steps", "20",
                  "--eval-every", "10"],
        "target": 2.0, "unit": "%", "ylim": (1.4, 3.0)},
}
TASKS.update({name: {**spec, "untuned": True} for name, spec in RECIPES.items()})


def mpi_env():
    """scripts/mpi_env.sh's settings, plus the repository on PYTHONPATH."""
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    })
    return env


def launch(args, task, runs, out, cluster_rate=None):
    """Run ``runs`` ([(method, seed, scale)]) of one task in a single launch of
    benchmarks/convergence_ranks.py (horovodrun on this machine, or ``cluster.sh run`` on the
    emulated cluster, 2 hosts x 2 ranks, when ``cluster_rate`` names its link rate, with
    ``-<round>`` after the first timing round: then results go to ``raw-<cluster_rate>/``); return one record per run (``error`` set if it is missing)."""
    from convergence_ranks import tag_of
    spec = TASKS[task]
    python = sys.executable
    raw = "raw" if cluster_rate is None else f"raw-{cluster_rate}"
    os.makedirs(os.path.join(out, raw), exist_ok=True)
    plan = [(m, seed, None if scale is None else default_lr(task, m) * scale)
            for m, seed, scale in runs]
    if cluster_rate is None:
        via = [os.path.join(os.path.dirname(python), "horovodrun"), "-np", str(args.np), "-H",
               f"localhost:{args.np}", "--mpi", "--mpi-args=--oversubscribe --bind-to none"]
    else:
        via = [CLUSTER, "run", "--per-host", "2", "--timeout",
               str(120 + args.timeout * len(runs)), "--"]
    cmd = [*via, python, os.path.join(ROOT, "benchmarks", "convergence_ranks.py"), "--example",
           spec["script"], "--task", task, "--out", os.path.join(out, raw), "--runs",
           json.dumps(plan), "--", *(spec["smoke"] if args.smoke else spec["args"])]
    t0 = time.perf_counter()
    timeout = 120 + args.timeout * len(runs)
    print(f"{task}: {len(runs)} runs in one launch on {args.np} ranks (timeout {timeout}s)",
          flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []

    def pump():  # echo the rank-0 progress lines as they come
        for line in proc.stdout:
            lines.append(line)
            if "<stdout>:[" in line:
                print("  " + line.split("<stdout>:", 1)[1].rstrip(), flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "timeout"
    reader.join(timeout=10)
    wall = time.perf_counter() - t0
    text = "".join(lines)
    log_name = f"{task}{'' if cluster_rate is None else '-' + cluster_rate}.txt"
    # a round's timed runs may be launches of their own (--timing-launches each): one log each
    with open(os.path.join(out, "logs", log_name), "w" if cluster_rate is None else "a") as fh:
        fh.write(" ".join(cmd) + "\n" + text)
    if rc != 0:
        print(f"  {task}: launch FAILED ({rc}) after {wall:.0f}s\n" +
              "\n".join(text.splitlines()[-20:]), flush=True)
    records = [read_run(os.path.join(out, raw, tag_of(task, method, seed, lr) + ".json"),
                        {"task": task, "method": method, "seed": seed, "scale": scale},
                        f"no result (launch exit {rc})")
               for (method, seed, scale), (_, _, lr) in zip(runs, plan)]
    return records, {"task": task, "runs": len(runs), "wall_s": wall, "rc": rc,
                     "in_runs_s": sum(r.get("wall", 0.0) for r in records)}


def read_run(path, fields, missing):
    """The record of one run from its JSON file, with ``fields`` (task, method, seed, scale);
    ``error`` set to ``missing`` where there is no file, to the refusal where hvdcomp refused."""
    if not os.path.exists(path):
        return {**fields, "error": missing}
    with open(path) as fh:
        rec = json.load(fh)
    if "refused" in rec:
        return {**fields, "error": rec["refused"], "refused": True}
    return {**rec, **fields, "wall": rec["wall_s"]}


def default_lr(task, method):
    """The example's default learning rate for ``method`` (examples/recipes.py, task ``task``)."""
    return recipes.rates(method, task).lr


def mean_curve(recs, metric):
    """Seed-mean of the curves (they share one step grid): [(step, value)]."""
    grids = [[(p["step"], p[metric]) for p in r["curve"]] for r in recs]
    n = min(len(g) for g in grids)
    return [(grids[0][i][0], statistics.fmean(g[i][1] for g in grids)) for i in range(n)]


def aggregate(records, tasks, methods, scales):
    """One row per (task, method, scale) with the table's fields."""
    rows = []
    for task in tasks:
        spec = TASKS[task]
        higher = spec["higher"]
        for scale in scales:
            base = [r for r in records if r["task"] == task and r["method"] == "none"
                    and r["scale"] == scale and "error" not in r]
            base_final = statistics.fmean(r["summary"]["final"] for r in base) if base else None
            for method in methods:
                recs = [r for r in records if r["task"] == task and r["method"] == method
                        and r["scale"] == scale]
                ok = [r for r in recs if "error" not in r]
                row = {"task": task, "method": method, "scale": scale, "seeds": len(recs),
                       "failed": len(recs) - len(ok), "metric": spec["metric"]}
                refused = [r["error"] for r in recs if r.get("refused")]
                if refused:
                    row.update(refused=True, why=refused[0].split(":")[0])
                if ok:
                    finals = [r["summary"]["final"] for r in ok]
                    s0 = ok[0]["summary"]
                    row.update(
                        mean=statistics.fmean(finals),
                        std=statistics.stdev(finals) if len(finals) > 1 else 0.0,
                        min=min(finals), max=max(finals),
                        lr=s0["lr"], optimizer=s0["optimizer"], momentum=s0.get("momentum"),
                        steps=s0["steps"],
                        bytes_per_step=statistics.fmean(r["summary"]["bytes_per_step"] for r in ok),
                        bytes_kind=s0["bytes_kind"],
                        fp32_ring_bytes=s0["fp32_ring_bytes_per_step"],
                        identical=all(r["summary"]["identical"] for r in ok),
                        train_s=statistics.fmean(r["summary"]["seconds"] for r in ok),
                        wall_s=statistics.fmean(r["wall"] for r in ok))
                    if base_final is not None:
                        if higher:
                            row["gap"] = 100 * (row["mean"] - base_final)  # pp, + is better
                            row["meets"] = row["gap"] >= -spec["target"]
                        else:
                            row["gap"] = 100 * (row["mean"] - base_final) / base_final  # %, + worse
                            row["meets"] = row["gap"] <= spec["target"]
                        reach = [st for st, v in mean_curve(ok, spec["metric"])
                                 if (v >= base_final if higher else v <= base_final)]
                        row["steps_to_baseline"] = reach[0] if reach else None
                rows.append(row)
    return rows


class Timed(NamedTuple):
    """One timed run (``timed_rounds``): its seconds per training step held past the first
    evaluation point (``held_step``), its setup seconds, ``to`` (step -> seconds to it), its
    timing ``round`` (1 where the record has none) and ``run``, its setup plus its training
    seconds (the whole job as a user waits for it, its first step included)."""
    step: float
    setup: float
    to: dict
    round: int
    run: float


def timed_rounds(timing, task, rate):
    """method -> one ``Timed`` per round (``--timing-rounds``) of the ``task`` runs timed at link
    ``rate``. Setup: the example's ``setup_seconds`` (rank 0's construction of the compressor:
    until 2026-12-01 the methods with numba kernels loaded them there, ~1 s; what every
    method's job pays alike, the optimizer, Horovod's broadcasts and the wait in them for the
    other ranks' start-up, 2-5 s here and varying by seconds, is left out), which a user's job
    pays once (0.0 in records without it). Seconds to a step: the run's training seconds up to that step of its curve,
    before its evaluation (its first step, the trace and Horovod's first negotiations
    included; empty in records from before 2026-12-03)."""
    found = {}
    for r in timing:
        if r["task"] == task and r.get("rate") == rate and "error" not in r:
            to = {p["step"]: p["seconds"] for p in r.get("curve", ()) if "seconds" in p}
            setup = r["summary"].get("setup_seconds", 0.0)
            found.setdefault(r["method"], []).append(
                Timed(held_step(r["summary"], to), setup, to, r.get("round", 1),
                      setup + r["summary"]["seconds"]))
    return found


def held_step(summary, seconds_to):
    """The seconds per training step of a run once it is past its first evaluation point
    (``seconds_to``: step -> seconds to it, from ``timed_rounds``): what the run's steps cost
    once the trace, Horovod's first negotiations and the compress-or-pass decision's first probe
    are behind it, which a whole-run mean spreads over every step. Runs whose curve carries no
    seconds (before 2026-12-03), or only one point past step 0, give the whole run's mean."""
    points = sorted((st, s) for st, s in seconds_to.items() if st > 0)
    if len(points) < 2:
        return summary["seconds"] / summary["steps"]
    (first, s0), (last, s1) = points[0], points[-1]
    return (s1 - s0) / (last - first)


def time_to(steps, rounds):
    """The seconds a run of ``rounds`` (``timed_rounds``' entries of one method) takes to
    ``steps`` training steps, and how they were found: ``"timed"``, the median over the rounds of
    each one's seconds to that step (a user's job: its first step, which is most of a short
    job, counted once); else ``"steps x mean step"``, ``steps`` times the median of the whole
    runs' mean step (which spreads the first step over every step; records from before
    2026-12-03). Setup is not included."""
    if rounds and all(steps in t.to for t in rounds):
        return statistics.median(t.to[steps] for t in rounds), "timed"
    return steps * statistics.median(t.step for t in rounds), "steps x mean step"


def by_round(rounds, seconds):
    """round -> ``seconds(timed)`` for each ``Timed`` of ``rounds`` where it is not None."""
    found = {t.round: seconds(t) for t in rounds}
    return {k: v for k, v in found.items() if v is not None}


def paired(mine, base):
    """Each round's ratio of a method's seconds to the baseline's in the same round (``mine``,
    ``base``: ``by_round`` dicts), in round order; rounds missing on either side are left out.
    The machine's drift between rounds, which the medians of each side carry separately, then
    cancels in each ratio."""
    return [mine[k] / base[k] for k in sorted(mine) if base.get(k)]


def seconds_to(steps):
    """``by_round``'s ``seconds`` for the time to ``steps`` with setup (None where the run's curve
    does not carry it)."""
    return lambda t: t.setup + t.to[steps] if steps in t.to else None


def add_times(rows, timing, rates):
    """Put on each row, per link rate, its step time (``held_step``: the median over the timing
    rounds, and each round's), its setup (the median), the time to the baseline's final quality
    (setup + ``time_to`` its steps to it: a user's job to that quality) and that time as a
    multiple of Horovod none's and fp16's, with each round's ratio to none's run of the same
    round (``x_none_rounds``; ``run_x_none_rounds``: the whole runs', for every method, also
    those that do not reach the quality: ``paired``); and on every row of a task the regime
    r = (none's step - the ceiling's) / the ceiling's step."""
    for rate in rates:
        for task in dict.fromkeys(r["task"] for r in rows):
            rounds = timed_rounds(timing, task, rate)
            step = {m: statistics.median(t.step for t in ts) for m, ts in rounds.items()}
            setup = {m: statistics.median(t.setup for t in ts) for m, ts in rounds.items()}
            task_rows = [r for r in rows if r["task"] == task]
            reach = {}
            for row in task_rows:
                t = step.get(row["method"])
                row.setdefault("times", {})[rate] = times = {"step_s": t,
                                                             "setup_s": setup.get(row["method"])}
                if len(rounds.get(row["method"], ())) > 1:
                    times["step_rounds_s"] = [t.step for t in rounds[row["method"]]]
                if t is not None and row.get("steps_to_baseline") is not None:
                    to, times["to_baseline_how"] = time_to(row["steps_to_baseline"],
                                                           rounds[row["method"]])
                    reach[row["method"]] = times["to_baseline_s"] = times["setup_s"] + to
                if "ceiling" in step and t:
                    times["of_ceiling"] = step["ceiling"] / t
                    if "none" in step:
                        times["r"] = (step["none"] - step["ceiling"]) / step["ceiling"]
            none = next((r for r in task_rows if r["method"] == "none"), {})
            none_rounds = rounds.get("none", ())
            for row in task_rows:
                times, mine = row["times"][rate], rounds.get(row["method"], ())
                for base in ("none", "fp16"):
                    if "to_baseline_s" in times and reach.get(base):
                        times[f"x_{base}"] = times["to_baseline_s"] / reach[base]
                # paired with none's run of the same round: the whole run, and the time to the
                # baseline's final quality where both reach it
                times["run_x_none_rounds"] = paired(by_round(mine, lambda t: t.run),
                                                    by_round(none_rounds, lambda t: t.run))
                if "x_none" in times:
                    times["x_none_rounds"] = paired(
                        by_round(mine, seconds_to(row["steps_to_baseline"])),
                        by_round(none_rounds, seconds_to(none["steps_to_baseline"])))


def time_table(rows, rates):
    """The time-to-accuracy table (markdown) of the rows that have times."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in rows if r.get("times")):
        spec = TASKS[task]
        task_rows = [r for r in rows if r["task"] == task]
        regime = ", ".join(f"{rate}: r = {task_rows[0]['times'][rate].get('r', math.nan):.2f}"
                           for rate in rates)
        lines += [f"**{task}**: {spec.get('recipe', '')}; time to the uncompressed run's final "
                  f"{spec['metric']} on the emulated cluster, 2 hosts x 2 ranks ({regime})", "",
                  "| method | final | gap | steps to it | " + " | ".join(
                      f"{rate}: step ms after the first point (of ceiling) | "
                      f"{rate}: time to it with setup (x none, x fp16) [x none per round] | "
                      f"{rate}: whole run x none's, paired per round: median [range]"
                      for rate in rates) + " |",
                  "| --- | --- | --- | --- |" + " --- | --- | --- |" * len(rates)]
        for r in task_rows:
            if "mean" not in r:
                why = "refused" if r.get("refused") else "failed"
                lines.append(f"| {r['method']} | {why}: {r.get('why', '')} |" + " |" * (2 + 3 * len(rates)))
                continue
            reach = r.get("steps_to_baseline")
            cells = [r["method"], f"{r['mean']:.4f}", f"{r.get('gap', math.nan):+.2f} {spec['unit']}",
                     f"{reach} / {r['steps']}" if reach is not None else f"not reached / {r['steps']}"]
            for rate in rates:
                t = r["times"][rate]
                spread = t.get("step_rounds_s")
                cells.append("" if t["step_s"] is None else
                             f"{1e3 * t['step_s']:.1f} ({100 * t.get('of_ceiling', math.nan):.0f}%)"
                             + (f" [{1e3 * min(spread):.1f}-{1e3 * max(spread):.1f}]"
                                if spread else ""))
                cells.append(f"{t['to_baseline_s']:.1f} s ({t['to_baseline_how']}), "
                             f"{t['setup_s']:.2f} s of it setup "
                             f"({t.get('x_none', math.nan):.2f}x, {t.get('x_fp16', math.nan):.2f}x)"
                             + (f" [{fmt_range(t['x_none_rounds'])}]"
                                if len(t.get("x_none_rounds", ())) > 1 else "")
                             if "to_baseline_s" in t else "-")
                runs = t.get("run_x_none_rounds", ())
                cells.append(f"{statistics.median(runs):.2f}x [{fmt_range(runs)}]" if runs else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def fmt_range(ratios):
    """``ratios``' range as ``'0.97-1.12x'``."""
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def timing_order(every, k):
    """Round ``k``'s (0-based) order of the timed configurations ``every``: row ``k`` of a
    balanced Latin square (Williams's: the sequence 0, 1, n-1, 2, n-2, ... shifted by ``k``).
    Over ``n = len(every)`` rounds each configuration runs once at each place and, for an even
    ``n``, right after each other one once; in any two rounds it follows two different ones.
    So neither its place in a round nor the run before it favours one. Until 2026-12-02 the
    order was rotated, which keeps every run's predecessor, so an effect of the run before could
    not be told from the configuration's own speed (in a run of recipe (d) on 2026-12-02, `none`
    came right after the compute ceiling in two rounds and was fastest in those; in this order
    it was still fastest in two of three rounds: the order was not what made it so)."""
    n = len(every)
    base = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    return [every[(b + k) % n] for b in base]


def on_cluster(args, tasks, methods, rates, out):
    """Time one seed of every (task, method) and of the compute ceiling at each link rate on the
    emulated cluster (benchmarks/cluster.sh; root), ``--timing-rounds`` times: a round runs every
    task and method once, in ``timing_order`` (a new order per round), so the machine's drift falls
    on every method alike. With ``--timing-launches each`` (the default) every timed run is a
    launch of its own, as a user's training is: each pays what a process pays once (hvdcomp's
    communicator and kernels, Horovod's first negotiations) instead of the first hvdcomp method
    of a shared launch paying it for the others (measured 0.23 s on recipe (a)'s first step,
    5% of its run). The records carry ``rate`` and ``round``; round k > 1 is saved in
    ``out/raw-<rate>-<k>/``, the first in ``out/raw-<rate>/``. Runs already there (an earlier
    call with the same --out) are read, not run again."""
    from convergence_ranks import tag_of
    every = [*methods, "ceiling"]
    labels = {rate: [rate] + [f"{rate}-{k}" for k in range(2, args.timing_rounds + 1)]
              for rate in rates}

    def path(task, method, label):
        return os.path.join(out, f"raw-{label}", tag_of(task, method, 0, None) + ".json")
    todo = {(task, label): [m for m in every if not os.path.exists(path(task, m, label))]
            for task in tasks for rate in rates for label in labels[rate]}
    if any(todo.values()):
        subprocess.run([CLUSTER, "down"], capture_output=True)
        subprocess.run([CLUSTER, "up", "2", rates[0]], check=True)
        try:
            for rate in rates:
                subprocess.run([CLUSTER, "rate", rate], check=True)
                for k, label in enumerate(labels[rate]):
                    for task in tasks:
                        runs = [(m, 0, None) for m in timing_order(every, k)
                                if m in todo[task, label]]
                        groups = ([[r] for r in runs] if args.timing_launches == "each"
                                  else [runs] if runs else [])
                        for group in groups:
                            launch(args, task, group, out, cluster_rate=label)
        finally:
            subprocess.run([CLUSTER, "down"], capture_output=True)
    return [{**read_run(path(task, m, label), {"task": task, "method": m, "seed": 0,
                                               "scale": None}, "no result"),
             "rate": rate, "round": k + 1}
            for rate in rates for k, label in enumerate(labels[rate]) for task in tasks
            for m in every]


def fmt_bytes(b):
    return f"{b / 1e3:.1f} kB" if b < 1e6 else f"{b / 1e6:.2f} MB"


def write_table(rows, out, sweep):
    cols = ["task", "method", "scale", "optimizer", "lr", "momentum", "steps", "seeds", "failed",
            "metric", "mean", "std", "min", "max", "gap", "meets", "steps_to_baseline",
            "bytes_per_step", "bytes_kind", "fp32_ring_bytes", "identical", "train_s", "wall_s"]
    with open(os.path.join(out, "table.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = []
    for task in dict.fromkeys(r["task"] for r in rows):
        spec = TASKS[task]
        what = "test accuracy" if spec["higher"] else "validation loss (nats/char)"
        gap = "gap vs none (pp)" if spec["higher"] else "gap vs none (% of loss)"
        lines += [f"**{task}** ({what}; target: within {spec['target']:g} {spec['unit']})", "",
                  f"| method |{' lr scale |' if sweep else ''} optimizer, lr | final: mean ± std "
                  f"[min, max] | {gap} | meets | steps to baseline | bytes/step/rank | "
                  "ranks identical |",
                  "| --- |" + (" --- |" if sweep else "") + " --- | --- | --- | --- | --- | --- | --- |"]
        for r in (r for r in rows if r["task"] == task):
            if "mean" not in r:
                what = f"refused ({r['why']})" if r.get("refused") else "failed"
                lines.append(f"| {r['method']} |{' %g |' % r['scale'] if sweep else ''} "
                             f"all {r['seeds']} runs {what} | | | | | | |")
                continue
            opt = r["optimizer"] + (f" (momentum {r['momentum']:g})"
                                    if r.get("momentum") and r["optimizer"] == "sgd" else "")
            n = r["seeds"] - r["failed"]
            final = (f"{r['mean']:.4f} ± {r['std']:.4f} [{r['min']:.4f}, {r['max']:.4f}]"
                     + (f" ({r['failed']} failed)" if r["failed"] else "")) if n > 1 \
                else f"{r['mean']:.4f}"
            g = r.get("gap")
            gap_s = "" if g is None else (f"{g:+.2f}")
            meets = "" if g is None else ("yes" if r["meets"] else "**no**")
            reach = r.get("steps_to_baseline")
            reach_s = f"{reach} / {r['steps']}" if reach is not None else f"not reached / {r['steps']}"
            ratio = r["fp32_ring_bytes"] / r["bytes_per_step"] if r["bytes_per_step"] else 0
            sent = (f"{fmt_bytes(r['bytes_per_step'])} ({r['bytes_kind']}"
                    + (f", {ratio:.1f}x < fp32" if r["bytes_kind"] == "measured" else "") + ")")
            lines.append(f"| {r['method']} |{' %g |' % r['scale'] if sweep else ''} {opt} "
                         f"{r['lr']:g} | {final} | {gap_s} | {meets} | {reach_s} | {sent} | "
                         f"{'yes' if r['identical'] else '**no**'} |")
        lines.append("")
    text = "\n".join(lines)
    with open(os.path.join(out, "table.md"), "w") as fh:
        fh.write(text)
    return text


# One colour per setting (matplotlib's 10 cycle colours, then 4 more), fixed by METHODS' order.
COLORS = [f"C{i}" for i in range(10)] + ["black", "darkgoldenrod", "teal", "magenta"]


def color(method):
    order = METHODS + [m for m in registry.PRESETS if m not in METHODS]
    return COLORS[order.index(method) % len(COLORS)]


def plot(records, rows, out, tasks, methods, args_smoke=False):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        spec = TASKS[task]
        for method in methods:
            ok = [r for r in records if r["task"] == task and r["method"] == method
                  and "error" not in r and r["scale"] is None]
            if not ok:
                continue
            for r in ok:  # each seed faintly, the seed mean boldly
                ax.plot([p["step"] for p in r["curve"]], [p[spec["metric"]] for p in r["curve"]],
                        alpha=0.2, lw=0.8, color=color(method))
            mc = mean_curve(ok, spec["metric"])
            ax.plot([s for s, _ in mc], [v for _, v in mc], lw=1.8, label=method,
                    color=color(method))
        ax.set_title(f"{task}: {spec['metric']} ({len(ok)} seeds, 4 ranks)"
                     if ok else task)
        ax.set_xlabel("step")
        ax.set_ylabel(spec["metric"])
        if not args_smoke:
            ax.set_ylim(*spec["ylim"])  # the interesting part (the full curve is in raw/)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=90)
    plt.close(fig)


def load_records(dirs, tasks, methods):
    """The non-sweep runs saved under ``<dir>/raw/`` of earlier outputs (for --from); each file
    is named ``<task>-<method>-s<seed>.json`` (``convergence_ranks.tag_of``). A run found in
    several dirs is taken from the last."""
    import glob
    records = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "raw", "*.json"))):
            name = os.path.basename(path)[:-len(".json")]
            task = max((t for t in tasks if name.startswith(t + "-")), key=len, default=None)
            method, _, seed = name[len(task or "") + 1:].rpartition("-s")
            if task is None or method not in methods or "-lr" in name:
                continue
            records[task, method, int(seed)] = read_run(
                path, {"task": task, "method": method, "seed": int(seed), "scale": None}, None)
    return list(records.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="digits,charlm")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--smoke", action="store_true",
                    help="a few steps per run (the test suite's setting; numbers meaningless)")
    ap.add_argument("--lr-scales", default=None,
                    help="comma-separated multipliers of each method's default lr (a sweep)")
    ap.add_argument("--link-rates", default=None, metavar="RATE[,RATE]",
                    help="also time one seed of every run, and the compute ceiling, on the "
                         "emulated cluster at these link rates (e.g. 1gbit,20mbit; root): the "
                         "time-to-accuracy table")
    ap.add_argument("--timing-rounds", type=int, default=1, metavar="N",
                    help="with --link-rates: time every run N times, in turn (the step time is "
                         "the median; the table shows the range)")
    ap.add_argument("--timing-launches", choices=("each", "shared"), default="each",
                    help="with --link-rates: every timed run in a launch of its own (each, as a "
                         "user's job), or a task's runs of a round in one launch (shared)")
    ap.add_argument("--out", default=None, help="default: results/convergence/<stamp>")
    ap.add_argument("--from", dest="from_dirs", default=None, metavar="DIR[,DIR]",
                    help="run nothing: rebuild table and curves from earlier outputs' raw/*.json")
    args = ap.parse_args(argv)
    tasks = [t for t in args.tasks.replace("recipes", ",".join(RECIPES)).split(",") if t]
    methods = [m for m in args.methods.split(",") if m]
    for t in tasks:
        if t not in TASKS:
            ap.error(f"unknown task {t!r} (choose from {sorted(TASKS)})")
    for m in methods:
        if m not in METHODS and m not in registry.PRESETS:
            ap.error(f"unknown method {m!r} (choose from {METHODS} or another preset of "
                     f"hvdcomp/registry.py)")
    if "none" not in methods:
        methods = ["none"] + methods  # the baseline every gap is measured against
    scales = [float(x) for x in args.lr_scales.split(",")] if args.lr_scales else [None]
    if args.lr_scales and any(TASKS[t].get("untuned") for t in tasks):
        ap.error("--lr-scales sweeps the methods' own rates; a recipe has one rate for all")
    out = args.out or os.path.join(ROOT, "results", "convergence",
                                   time.strftime("%Y%m%d-%H%M%S") + ("-smoke" if args.smoke else ""))
    for sub in ("raw", "logs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)

    t0 = time.perf_counter()
    records, launches = [], []
    if args.from_dirs:
        records = load_records(args.from_dirs.split(","), tasks, methods)
        tasks = [t for t in tasks if any(r["task"] == t for r in records)]
    for task in tasks if not args.from_dirs else []:
        runs = [(m, seed, scale) for scale in scales for m in methods
                for seed in range(args.seeds)]
        recs, info = launch(args, task, runs, out)
        records += recs
        launches.append(info)
    rows = aggregate(records, tasks, methods, scales)
    text = write_table(rows, out, sweep=scales != [None])
    timing = []
    if args.link_rates:
        rates = args.link_rates.split(",")
        timing = on_cluster(args, tasks, methods, rates, out)
        add_times(rows, timing, rates)
        times = "\n" + time_table(rows, rates)
        text += times
        with open(os.path.join(out, "table.md"), "a") as fh:
            fh.write(times)
    total = time.perf_counter() - t0
    if scales == [None]:
        plot(records, rows, out, tasks, methods, args.smoke)
    ok = [r for r in records if "error" not in r]
    if not ok:
        raise SystemExit("no results")
    timing = {"total_s": total, "runs": len(records), "launches": launches,
              "cluster_runs": [{k: r[k] for k in ("task", "method", "rate", "round")} | (
                  {"step_s": r["summary"]["seconds"] / r["summary"]["steps"]} if "summary" in r
                  else {"error": r["error"]}) for r in timing],
              "mean_run_s": statistics.fmean([r["wall"] for r in ok] or [math.nan]),
              "mean_train_s": statistics.fmean([r["summary"]["seconds"] for r in ok] or [math.nan]),
              "load_average_at_end": os.getloadavg()}
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump({"argv": sys.argv, "rows": rows, "timing": timing}, fh, indent=1)
    print(text)
    per = ", ".join(f"{x['task']}: {x['runs']} runs, launch {x['wall_s']:.0f}s of which "
                    f"{x['in_runs_s']:.0f}s in runs" for x in launches)
    print(f"{len(records)} runs in {total:.0f}s ({per}; load average at end "
          f"{timing['load_average_at_end'][0]:.1f}); results in {out}")
    failed = [r for r in records if "error" in r and not r.get("refused")]
    not_identical = [r for r in records if "summary" in r and not r["summary"]["identical"]]
    return 1 if failed or not_identical else 0


if __name__ == "__main__":
    sys.exit(main())
