"""The methods every benchmark compares: Horovod's own fp32 and fp16, and every hvdcomp method
(``hvdcomp/registry.py``), for either framework; and what the training-step benchmarks
(``train_step_bench.py``, ``tf_step_bench.py``) share: their common arguments and records."""
import ast
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdcomp import registry  # noqa: E402

ALL_METHODS = ["hvd-fp32", "hvd-fp16", *registry.METHODS]


def make_compression(method, hvd):
    """The ``compression=`` argument of ``method`` for Horovod module ``hvd`` (horovod.torch or
    horovod.tensorflow): Horovod's Compression.none / fp16, or a fresh hvdcomp instance with its
    default settings (``Name@key=value@...``: with those string settings, e.g.
    ``Marsit@hierarchy=flat`` or ``TopK@fusion=auto``)."""
    if method == "hvd-fp32":
        return hvd.Compression.none
    if method == "hvd-fp16":
        return hvd.Compression.fp16
    name, *given = method.split("@")  # e.g. 'Marsit@hierarchy=flat@fusion=auto'
    return registry.METHODS[name](**dict(kv.split("=", 1) for kv in given))


def parse_spec(spec):
    """``(name, settings)`` of a spec ``Name@key=value@...`` whose values are Python literals
    (``"SketchFusion@ratio=0.1@rows=1"``, ``"topk@decision='compress'"``); ``make_compression``
    takes its values as strings instead."""
    name, *given = spec.split("@")
    return name, {k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in given)}


def add_step_args(ap):
    """The arguments every step benchmark takes (besides its model and API)."""
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=60)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="")


PHASES = ("encode", "comm", "decode")


def step_phases(comm, comp):
    """hvdcomp's seconds per phase (``PHASES``) of the step just taken, each the slowest rank's
    (collective over ``comm``); None for Horovod's own compressors (no ``last_stats``)."""
    st = getattr(comp, "last_stats", None)
    if st is None:
        return None
    mine = [st.phases.get(k, 0.0) for k in PHASES]
    return {k: max(v) for k, v in zip(PHASES, zip(*comm.allgather(mine)))}


def step_record(rec, timed, first, sent, phases=()):
    """``rec`` (kind, framework, api, model, label, ranks, hosts, method, status, params,
    tensors, compute_seconds) completed with the step figures: ``timed`` (the timed steps'
    slowest-rank seconds), ``first`` (the first step's), ``sent`` (hvdcomp's bytes sent per rank
    per timed step; empty for Horovod, then the nominal ring volume), ``phases`` (hvdcomp's
    ``step_phases`` of the timed steps; empty for Horovod). With phases, ``rec`` gets the median
    of each phase and ``rest``: the median step minus their sum (forward, backward, the optimizer,
    Horovod's own work)."""
    rec["steps"] = len(timed)
    if rec["status"] != "ok":
        return rec
    rec["seconds"], rec["first_seconds"] = statistics.median(timed), first
    rec["spread"] = [min(timed), max(timed)]
    if phases:
        for k in PHASES:
            rec[k] = statistics.median(p[k] for p in phases)
        rec["rest"] = max(rec["seconds"] - sum(rec[k] for k in PHASES), 0.0)
    if sent:
        rec["bytes_per_rank"], rec["bytes_kind"] = statistics.median(sent), "measured"
    else:
        item = 2 if rec["method"] == "hvd-fp16" else 4
        rec["bytes_per_rank"] = 2 * (rec["ranks"] - 1) / rec["ranks"] * rec["params"] * item
        rec["bytes_kind"] = "nominal ring"
    return rec


def report_step(out, rec, what):
    """Print ``rec`` as one line (``what``: e.g. 'train', 'tf-tape') and append it to ``out``
    (an open file, or None)."""
    status = rec["status"]
    ph = (" (" + ", ".join(f"{k} {rec[k] * 1e3:.0f}" for k in (*PHASES, "rest")) + ")"
          if status == "ok" and "rest" in rec else "")
    print(f"{rec['label']:>8} {what} {rec['method']:<13} "
          + (f"{rec['seconds'] * 1e3:9.1f} ms/step (first step {rec['first_seconds'] * 1e3:.0f} ms)"
             + ph if status == "ok" else status[:200]), flush=True)
    if out:
        out.write(json.dumps(rec) + "\n")
        out.flush()
