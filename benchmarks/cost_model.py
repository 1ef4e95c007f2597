"""A cost model of one gradient all-reduce per method, fitted to allreduce_bench.py's records:

    time = a + b * bytes / bandwidth + c * elements

a: fixed cost (latency, collectives' set-up), b: seconds per (byte / (bytes/s)) on the slowest
link (1.0 would be a link used at exactly its shaped rate), c: encode/decode/merge seconds per
element. ``bytes`` is what left one emulated host on its shaped link per call (kernel counters:
the bottleneck in a 2-host cluster), ``bandwidth`` the shaped rate in bytes/s. Fitted per method
by non-negative least squares on relative error (each point weighted by 1/time, so small and
large sizes count alike), and reported with the fit error on the measured points.

    python benchmarks/cost_model.py results/latest/raw.jsonl   (prints Markdown)

Prediction for NODES x PER_NODE ranks (default 8 x 8) at 10 and 25 Gbit/s, assumptions:
- one rank per GPU, each rank's encode/decode as fast per element as a rank here (c unchanged).
  Here 4 ranks share 2 CPU cores and other jobs, so c is pessimistic for CPUs and says nothing
  about GPU kernels (not measured: no GPU);
- the link bytes per host scale with the method's traffic law (``hvdcomp.registry.EXPECT[m]
  .traffic``) from the measured 2 x 2 figure (per element): flat ring over P ranks ordered by
  node ('ring': Horovod fp32/fp16 via MPI, Marsit; 'two-rings': SketchFusion): 2(P-1)/P;
  'nodes' (BinSGDM: intra-node int8, 1 bit per element to every other node): N-1; 'tree'
  (TopK): 8 + 4 ceil(log2 P) + 8 (P-1)/P bytes per selected element; 'allgather' (EFSignSGD:
  every rank's bits to every other rank): P-1;
- the fixed cost a scales with the number of sequential message rounds: ring 2(P-1); BinSGDM
  2(L-1) + (N-1); TopK 2 ceil(log2 P) + 2(P-1); SketchFusion two rings 4(P-1); all-gather P-1;
- the links run at the same efficiency b as the emulated ones; no congestion in the switch
  (full bisection), no overlap with the backward pass (one blocking all-reduce).
"""
import json
import math
import os
import sys

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdcomp import registry  # noqa: E402

ORDER = ["hvd-fp32", "hvd-fp16", *registry.METHODS]


def law(method):
    """The traffic law of ``method`` (Horovod's own: a ring)."""
    return registry.EXPECT[method].traffic if method in registry.EXPECT else "ring"


def traffic_scale(method, nodes, per_node):
    p = nodes * per_node
    return {"nodes": lambda: max(nodes - 1, 0),
            "tree": lambda: 8 + 4 * math.ceil(math.log2(p)) + 8 * (p - 1) / p,
            "allgather": lambda: p - 1,
            }.get(law(method), lambda: 2 * (p - 1) / p)()


def rounds(method, nodes, per_node):
    p = nodes * per_node
    return {"nodes": lambda: 2 * (per_node - 1) + (nodes - 1),
            "tree": lambda: 2 * math.ceil(math.log2(p)) + 2 * (p - 1),
            "two-rings": lambda: 4 * (p - 1),
            "allgather": lambda: p - 1,
            }.get(law(method), lambda: 2 * (p - 1))()


def load(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r for r in recs if r["status"] == "ok" and r.get("rate_bps")]


def link_bytes(r):
    v = r.get("link_bytes_per_host")
    return v if v is not None else r["bytes_per_rank"]


def fit(points):
    """points: (time, bytes, bandwidth B/s, elements) -> (a, b, c), relative errors."""
    t = np.array([p[0] for p in points])
    X = np.array([[1.0, p[1] / p[2], p[3]] for p in points])
    w = 1.0 / t
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((X / scale) * w[:, None], t * w)
    coef = coef / scale
    pred = X @ coef
    return coef, (pred - t) / t


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "results/latest/raw.jsonl"
    nodes, per_node = 8, 8
    recs = load(path)
    if not recs:
        raise SystemExit(f"no usable records in {path}")
    here_nodes, here_per = recs[0]["hosts"], recs[0]["ranks_per_host"]
    methods = [m for m in ORDER if any(r["method"] == m for r in recs)]
    models = {}
    print(f"## Cost model: time = a + b * link_bytes / bandwidth + c * elements\n")
    print(f"Fitted on {len(recs)} measurements ({here_nodes} hosts x {here_per} ranks, "
          f"from `{path}`).\n")
    print("| method | a (ms) | b | c (ns/element) | link bytes / element (2x2) | points | "
          "RMS rel. error | max rel. error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in methods:
        pts = [(r["seconds"], link_bytes(r), r["rate_bps"] / 8, r["elements"])
               for r in recs if r["method"] == m]
        (a, b, c), rel = fit(pts)
        per_elem = float(np.median([p[1] / p[3] for p in pts]))
        models[m] = (a, b, c, per_elem)
        print(f"| {m} | {a*1e3:.1f} | {b:.2f} | {c*1e9:.1f} | {per_elem:.3f} | {len(pts)} | "
              f"{np.sqrt(np.mean(rel**2))*100:.0f}% | {np.max(np.abs(rel))*100:.0f}% |")
    print()
    for n in (25_000_000, 100_000_000):
        print(f"### Predicted: {nodes} nodes x {per_node} ranks, {n/1e6:g}M-element gradient\n")
        print("| method | 10 Gbit/s (ms) | x vs fp32 | x vs fp16 | 25 Gbit/s (ms) | x vs fp32 | "
              "x vs fp16 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        pred = {}
        for m, (a, b, c, per_elem) in models.items():
            s = traffic_scale(m, nodes, per_node) / traffic_scale(m, here_nodes, here_per)
            h = rounds(m, nodes, per_node) / rounds(m, here_nodes, here_per)
            byts = per_elem * n * s
            pred[m] = {g: a * h + b * byts / (g * 1e9 / 8) + c * n for g in (10, 25)}
        for m in models:
            cells = []
            for g in (10, 25):
                t = pred[m][g]
                r32 = pred.get("hvd-fp32", {}).get(g)
                r16 = pred.get("hvd-fp16", {}).get(g)
                cells += [f"{t*1e3:.0f}", f"{r32/t:.2f}" if r32 else "",
                          f"{r16/t:.2f}" if r16 else ""]
            print(f"| {m} | " + " | ".join(cells) + " |")
        print()
    print("Assumptions: see the docstring of benchmarks/cost_model.py (c as measured on 4 CPU "
          "ranks sharing 2 cores; traffic and round counts scaled by each method's law; links at "
          "the fitted efficiency b; no overlap with backward, no switch congestion).")


if __name__ == "__main__":
    main()
