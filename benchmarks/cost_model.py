"""A cost model of one gradient all-reduce per method, fitted to allreduce_bench.py's records
(one or several emulated layouts: hosts x ranks per host; one or several runs of each):

    time = a * rounds + b * link_bytes / bandwidth + c * codec_elements
           + e * stage_elements + d

a: seconds per sequential message round (latency, a collective's set-up, the wait for the
slowest rank), b: seconds per (byte / (bytes/s)) on the busiest host link (1.0 would be a link
used at exactly its shaped rate), c: encode/decode/merge seconds per element of the method's
codec on a core of its own (``codec_elements``: the gradient's elements, or in node stages the
rank's shard of them, elements / ranks per node; fitted on them times the run's ranks per core:
the emulated ranks share the machine's cores; predictions take one core per rank), e: seconds
per element of the node stages' float32 passes (``stage_elements``: the gradient's elements in
node stages, else 0; 2026-11-29: with one term for both, c, SketchFusion's staged fit missed
2 x 2 and 4 x 1 by 20% in opposite directions, its codec work per rank being half as large at 2
x 2), d: seconds per call whatever the layout
and size (hvdcomp's per-call Python, the batch's agreement all-gather, a collective's set-up:
without it the fixed cost lands on a or c, and the small sizes miss). ``rounds`` is the
method's count of sequential rounds for the layout (``rounds`` below), ``link_bytes`` what left
the busiest emulated host on its shaped link per call (kernel counters), ``bandwidth`` the shaped
rate in bytes/s. Fitted per method (and per variant: ``Marsit@hierarchy=flat`` is fitted apart
from ``Marsit``) with non-negative coefficients for the smallest largest relative error
(``fit``: small and large sizes count alike), over every layout in the records, and reported
with the fit error on each layout. A point (method, layout, size, rate) measured in several runs (files)
counts once, at the median of the runs' medians: single runs on this shared machine move by
+-25%, more than the 20% the model is held to. PowerSGD's records of a vector gradient
(``allreduce_bench.py`` without ``--columns``) are left out: PowerSGD sends a vector whole.

    python benchmarks/cost_model.py results/latest/raw.jsonl [more.jsonl ...]   (prints Markdown)

Prediction for 8 x 8 and 32 x 8 ranks at 10 and 25 Gbit/s, assumptions:
- one rank per GPU, each rank's encode/decode as fast per element as a rank here (c unchanged).
  Here the ranks share 2 CPU cores and other jobs, so c is pessimistic for CPUs and says nothing
  about GPU kernels;
- the link bytes per host scale with the method's traffic law from the measured bytes per
  element (``traffic_scale``): 'ring' (Horovod fp32/fp16, Marsit), 'two-rings' (SketchFusion)
  and 'two-allreduces' (PowerSGD: MPI's own) 2(P-1)/P; 'nodes' (BinSGDM: 1 bit per element to the other
  node with 2 nodes, merged along a ring of the nodes from 3) N-1, then 2(N-1)/N; 'tree' (TopK)
  8 + 4 ceil(log2 P) + 8 (P-1)/P bytes per selected element; 'votes' (EF-signSGD: an all-gather
  of the bits with 2 ranks, vote counts along a ring from 3, ``hvdcomp.methods.efsignsgd.votes.ring_bits``)
  P-1, then about log2 P. In node stages (``hvdcomp.hierarchical``: the methods it wraps,
  several nodes of several ranks, not ``@hierarchy=flat``) the law applies to the N nodes: each
  node sends what one rank of an N-rank flat layout sends;
- rounds: ring 2(P-1); two rings 4(P-1); two of MPI's all-reduces 4 ceil(log2 P) (each as a
  recursive halving and doubling: Open MPI picks its algorithm by size); BinSGDM 2(L-1) +
  (N-1), from 3 nodes 2(L-1) + 2(N-1); TopK 4 ceil(log2 P) (the tree up and down, then MPI's
  all-reduce); votes P-1, from 3 ranks 2(P-1); in node stages the method's rounds over N ranks
  plus 2 (the node's barriers);
- the links run at the fitted efficiency b; no congestion in the switch (full bisection), no
  overlap with the backward pass (one blocking all-reduce).
"""
import json
import math
import os
import sys

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdcomp import registry  # noqa: E402
from hvdcomp.methods.efsignsgd import votes  # noqa: E402
from hvdcomp.comm.hierarchy import merges  # noqa: E402

ORDER = ["hvd-fp32", "hvd-fp16", *registry.METHODS]
OWN_STAGES = {m for m, cls in registry.METHODS.items() if cls.Method.own_stages}
PREDICT = ((8, 8), (32, 8))
CORES = os.cpu_count() or 1  # the machine the records were measured on (run this there)


def base(method):
    """``'Marsit'`` of ``'Marsit@hierarchy=flat'``."""
    return method.split("@")[0]


# How each method's bytes and message rounds grow with the world (the module docstring):
# "ring", "two-rings" (SketchFusion), "two-allreduces" (PowerSGD: MPI's own,
# hvdcomp.comm.mpi_allreduce), "tree" (TopK), "nodes" (BinSGDM), "votes" (EF-signSGD,
# hvdcomp.methods.efsignsgd.votes); every method of hvdcomp.registry has one (benchmarks/tests/test_cost_model.py).
LAWS = {"Marsit": "ring", "BinSGDM": "nodes", "TopK": "tree", "SketchFusion": "two-rings",
        "EFSignSGD": "votes", "PowerSGD": "two-allreduces"}


def law(method):
    """The traffic law of ``method`` (Horovod's own: a ring)."""
    return LAWS.get(base(method), "ring")


def staged(method, nodes, per_node):
    """Whether ``method`` runs in hvdcomp's node stages on ``nodes`` x ``per_node`` ranks."""
    return (base(method) in registry.METHODS and base(method) not in OWN_STAGES
            and "hierarchy=flat" not in method and nodes > 1 and per_node > 1)


def traffic_scale(method, nodes, per_node):
    if staged(method, nodes, per_node):
        return traffic_scale(method, nodes, 1)
    p = nodes * per_node
    return {"nodes": lambda: 2 * (nodes - 1) / nodes if merges(nodes) else max(nodes - 1, 0),
            "tree": lambda: 8 + 4 * math.ceil(math.log2(p)) + 8 * (p - 1) / p,
            "votes": lambda: votes.ring_bits(p) if votes.ring_pays(p) else p - 1,
            }.get(law(method), lambda: 2 * (p - 1) / p)()


def work(method, nodes, per_node, elements):
    """``(codec_elements, stage_elements)`` of one rank for a gradient of ``elements``: in node
    stages the method codes the rank's shard and the stages pass over every element."""
    if staged(method, nodes, per_node):
        return elements / per_node, float(elements)
    return float(elements), 0.0


def rounds(method, nodes, per_node):
    if staged(method, nodes, per_node):
        return rounds(method, nodes, 1) + 2
    p = nodes * per_node
    return {"nodes": lambda: 2 * (per_node - 1) + (nodes - 1) * (2 if merges(nodes) else 1),
            "tree": lambda: 4 * math.ceil(math.log2(p)),
            "two-rings": lambda: 4 * (p - 1),
            "two-allreduces": lambda: 4 * math.ceil(math.log2(p)),
            "votes": lambda: 2 * (p - 1) if votes.ring_pays(p) else p - 1,
            }.get(law(method), lambda: 2 * (p - 1))()


def load(paths):
    """The usable records of ``paths`` (allreduce_bench.py's raw.jsonl files), one per point:
    where several files measured the same point, its median over them (``pooled``)."""
    recs = []
    for path in paths:
        with open(path) as f:
            recs += [json.loads(line) for line in f if line.strip()]
    return pooled([r for r in recs if r["status"] == "ok" and r.get("rate_bps")
                   and (base(r["method"]) != "PowerSGD" or r.get("columns"))])


def pooled(recs):
    """One record per (method, layout, elements, rate, columns): the first one's fields, with
    ``seconds`` and ``link_bytes_per_host`` the medians over the records of that point, and
    ``runs`` their number."""
    points = {}
    for r in recs:
        key = (r["method"], layout(r), r["elements"], r["rate_bps"], r.get("columns", 0))
        points.setdefault(key, []).append(r)
    out = []
    for same in points.values():
        out.append({**same[0], "runs": len(same),
                    "seconds": float(np.median([r["seconds"] for r in same])),
                    "link_bytes_per_host": float(np.median([link_bytes(r) for r in same]))})
    return out


def link_bytes(r):
    v = r.get("link_bytes_per_host")
    v = r["bytes_per_rank"] if v is None else v
    return max(v) if isinstance(v, list) else v


def layout(r):
    return r["hosts"], r["ranks_per_host"]


def sharing(r):
    """Ranks per core of the run (at least 1): every emulated rank shares this machine's cores,
    so a rank's per-element work takes that many times longer than on a core of its own."""
    return max(r["ranks"] / CORES, 1.0)


def fit(points):
    """points: (time, rounds, bytes, bandwidth B/s, *elements) -> (a, b, *c, d) (one c per
    elements column), relative errors. The non-negative coefficients with the smallest largest
    relative error over the points (a Chebyshev fit, a linear program): the model is held to
    its largest error on each layout, which a least-squares fit leaves to a few points (9-29%
    on the pooled data of 2026-11-28 before TopK's and PowerSGD's re-measure, where this fit gave
    8-22%)."""
    t = np.array([p[0] for p in points])
    X = np.array([[p[1], p[2] / p[3], *p[4:], 1.0] for p in points], dtype=np.float64)
    rel = X / t[:, None]  # relative error of coefficients c: rel @ c - 1
    scale = rel.max(axis=0)
    scale[scale == 0] = 1.0
    n, k = rel.shape
    # variables: c * scale, then the largest error z; rel @ c - 1 <= z and 1 - rel @ c <= z
    above = np.c_[rel / scale, -np.ones(n)]
    below = np.c_[-rel / scale, -np.ones(n)]
    found = linprog(np.r_[np.zeros(k), 1.0], A_ub=np.r_[above, below],
                    b_ub=np.r_[np.ones(n), -np.ones(n)], bounds=[(0, None)] * (k + 1))
    if not found.success:
        raise RuntimeError(f"cost model fit failed: {found.message}")
    coef = found.x[:k] / scale
    return coef, (X @ coef - t) / t


def fit_all(recs):
    """Per method: ``(a, b, c, e, d, link bytes per element per unit of traffic law)``, and the
    relative errors per layout."""
    order = [m for m in ORDER if any(base(r["method"]) == m for r in recs)]
    methods = sorted({r["method"] for r in recs}, key=lambda m: (order.index(base(m)), m))
    models, errors = {}, {}
    for m in methods:
        mine = [r for r in recs if r["method"] == m]
        pts = [(r["seconds"], rounds(m, *layout(r)), link_bytes(r), r["rate_bps"] / 8,
                *(w * sharing(r) for w in work(m, *layout(r), r["elements"]))) for r in mine]
        (a, b, c, e, d), rel = fit(pts)
        per_law = float(np.median([link_bytes(r) / r["elements"] / traffic_scale(m, *layout(r))
                                   for r in mine]))
        models[m] = (a, b, c, e, d, per_law)
        for r, e in zip(mine, rel):
            errors.setdefault(m, {}).setdefault(layout(r), []).append(e)
    return models, errors


def main():
    paths = sys.argv[1:] or ["results/latest/raw.jsonl"]
    recs = load(paths)
    if not recs:
        raise SystemExit(f"no usable records in {paths}")
    models, errors = fit_all(recs)
    layouts = sorted({layout(r) for r in recs})
    names = [f"{h}x{k}" for h, k in layouts]
    print("## Cost model: time = a * rounds + b * link_bytes / bandwidth + c * codec_elements "
          "+ e * stage_elements + d\n")
    runs = sorted({r["runs"] for r in recs})
    span = str(runs[0]) if runs[0] == runs[-1] else f"{runs[0]}-{runs[-1]}"
    print(f"Fitted on {len(recs)} points (layouts {', '.join(names)}; each the median of {span} "
          f"runs; from {', '.join(f'`{p}`' for p in paths)}).\n")
    print("| method | a (ms/round) | b | c (ns/element) | e (ns/element) | d (ms) | " + " | ".join(
        f"max rel. error {n}" for n in names) + " |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in names) + " |")
    for m, (a, b, c, e, d, _) in models.items():
        errs = [errors[m].get(lay) for lay in layouts]
        cells = ["" if err is None else f"{np.max(np.abs(err)) * 100:.0f}%" for err in errs]
        print(f"| {m} | {a*1e3:.2f} | {b:.2f} | {c*1e9:.1f} | {e*1e9:.1f} | {d*1e3:.1f} | "
              + " | ".join(cells) + " |")
    print()
    for n in (25_000_000, 100_000_000):
        print(f"### Predicted: {n/1e6:g}M-element gradient, ms per all-reduce (x vs Horovod "
              "fp32)\n")
        heads = [f"{N} x {L}, {g} Gbit/s" for N, L in PREDICT for g in (10, 25)]
        print("| method | " + " | ".join(heads) + " |")
        print("| --- | " + " | ".join("---:" for _ in heads) + " |")
        pred = {m: [a * rounds(m, N, L) + b * per_law * traffic_scale(m, N, L) * n
                    / (g * 1e9 / 8) + np.dot((c, e), work(m, N, L, n)) + d
                    for N, L in PREDICT for g in (10, 25)]
                for m, (a, b, c, e, d, per_law) in models.items()}
        ref = pred.get("hvd-fp32")
        for m, ts in pred.items():
            cells = [f"{t*1e3:.0f}" + (f" ({ref[i]/t:.1f}x)" if ref else "")
                     for i, t in enumerate(ts)]
            print(f"| {m} | " + " | ".join(cells) + " |")
        print()
    print("Assumptions: see the docstring of benchmarks/cost_model.py (c as measured on CPU "
          "ranks sharing 2 cores; traffic and round counts scaled by each method's law, in node "
          "stages over the nodes; links at the fitted efficiency b; no overlap with backward, no "
          "switch congestion).")


if __name__ == "__main__":
    main()
