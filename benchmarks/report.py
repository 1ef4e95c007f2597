"""Turn the records of ``allreduce_bench.py`` (JSON lines) into a Markdown table, a CSV and a PNG.

    python benchmarks/report.py results/bench-XXXX        (reads raw.jsonl and netprobe.jsonl)
    python benchmarks/report.py --train results/train-matrix-XXXX   (train_matrix.sh's
        train.jsonl: writes train_matrix.md and train_matrix.png)
    python benchmarks/report.py --tf-vs-torch results/tf-vs-torch-XXXX   (tf_vs_torch.sh's
        train.jsonl: writes tf_vs_torch.md and tf_vs_torch.png)
    python benchmarks/report.py --regimes results/regimes-XXXX   (regimes.sh's regimes.jsonl:
        writes regimes.md and regimes.png)

Writes ``table.md``, ``results.csv`` and ``allreduce.png`` in that folder and prints the table.
Speedups are the Horovod fp32 (and fp16) time at the same link rate and size, from the same run,
divided by the method's time.
"""
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdcomp import registry  # noqa: E402

ORDER = ["hvd-fp32", "hvd-fp16", *registry.METHODS]
COLS = ["rate", "elements", "method", "status", "ms", "encode_ms", "comm_ms", "decode_ms",
        "bytes_per_rank", "bytes_kind", "link_bytes_per_host", "speedup_vs_fp32",
        "speedup_vs_fp16", "comm_speedup_vs_fp32", "comm_speedup_vs_fp16", "reps"]


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rate_key(label):
    s = label.lower()
    for suf, m in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if s.endswith(suf):
            return float(s[:-len(suf)]) * m
    return 0.0


def fmt_elems(n):
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}K"


def rows_of(records):
    base = {(r["label"], r["elements"], r["method"]): r for r in records if r["status"] == "ok"}
    rows = []
    for r in sorted(records, key=lambda r: (rate_key(r["label"]), r["elements"],
                                            ORDER.index(r["method"]) if r["method"] in ORDER else 99)):
        row = {"rate": r["label"], "elements": r["elements"], "method": r["method"],
               "status": r["status"] if r["status"] == "ok" else r["status"][:80],
               "reps": r.get("reps", 0)}
        if r["status"] == "ok":
            row["ms"] = r["seconds"] * 1e3
            for k in ("encode", "comm", "decode"):
                row[f"{k}_ms"] = r[k] * 1e3 if k in r else None
            row["bytes_per_rank"] = r.get("bytes_per_rank")
            row["bytes_kind"] = r.get("bytes_kind")
            row["link_bytes_per_host"] = r.get("link_bytes_per_host")
            for ref in ("fp32", "fp16"):
                b = base.get((r["label"], r["elements"], f"hvd-{ref}"))
                row[f"speedup_vs_{ref}"] = b["seconds"] / r["seconds"] if b else None
                comm = r.get("comm")
                row[f"comm_speedup_vs_{ref}"] = b["seconds"] / comm if b and comm else None
        rows.append(row)
    return rows


def f(v, spec):
    return "" if v is None else format(v, spec)


def markdown(rows, probes):
    out = []
    for rate in sorted({r["rate"] for r in rows}, key=rate_key):
        p = probes.get(rate)
        out.append(f"### Link {rate}" + (f" (one TCP stream measured {p['mbit_per_s']:.0f} Mbit/s "
                                          "between the emulated hosts)" if p else ""))
        out.append("")
        out.append("| elements | method | ms / allreduce | encode ms | comm ms | decode ms | "
                   "MB sent / rank | MB on link / host | x vs fp32 | x vs fp16 | comm x vs fp32 | "
                   "comm x vs fp16 |")
        out.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                   "| ---: |")
        for r in rows:
            if r["rate"] != rate:
                continue
            if r["status"] != "ok":
                out.append(f"| {fmt_elems(r['elements'])} | {r['method']} | {r['status']} "
                           "| | | | | | | | | |")
                continue
            mb = r["bytes_per_rank"] / 1e6 if r["bytes_per_rank"] is not None else None
            link = (r["link_bytes_per_host"] / 1e6 if r["link_bytes_per_host"] is not None
                    else None)
            star = "*" if r["bytes_kind"] == "nominal ring" else ""
            out.append(
                f"| {fmt_elems(r['elements'])} | {r['method']} | {r['ms']:.1f} | "
                f"{f(r['encode_ms'], '.1f')} | {f(r['comm_ms'], '.1f')} | "
                f"{f(r['decode_ms'], '.1f')} | {f(mb, '.2f')}{star} | {f(link, '.2f')} | "
                f"{f(r['speedup_vs_fp32'], '.2f')} | {f(r['speedup_vs_fp16'], '.2f')} | "
                f"{f(r['comm_speedup_vs_fp32'], '.1f')} | {f(r['comm_speedup_vs_fp16'], '.1f')} |")
        out.append("")
    out.append("ms / allreduce: median over the timed calls of the slowest rank's time of one "
               "`hvd.allreduce` (compress + communicate + decompress). encode/comm/decode: "
               "hvdcomp's `last_stats.phases` (slowest rank per phase, so they need not add up). "
               "MB sent / rank: hvdcomp's byte counters (metadata included); * = Horovod, nominal "
               "ring volume 2(P-1)/P x n x itemsize. MB on link / host: bytes that left each "
               "emulated host on its shaped link per call (kernel counters; includes barriers). "
               "x vs fp32/fp16: Horovod's allreduce time / this method's whole time (encode + "
               "collective + decode). comm x: Horovod's allreduce time / this method's collective "
               "alone (the comm phase: ring or tree with its per-hop merges, encode and decode "
               "excluded), i.e. what the 1-bit wire format buys once encode/decode run at "
               "accelerator speed.")
    return "\n".join(out)


MODEL_TITLES = {"mlp": "2-layer MLP", "mlp48": "48-tensor MLP", "transformer": "transformer LM"}


def _train_base(records):
    """{(label, model, method): record} of the ok PyTorch optimizer records."""
    return {(r["label"], r.get("model", "transformer"), r["method"]): r for r in records
            if r["status"] == "ok" and r.get("framework", "torch") == "torch"}


def _train_x(base, r, ref):
    b = base.get((r["label"], r.get("model", "transformer"), f"hvd-{ref}"))
    return b["seconds"] / r["seconds"] if b else None


def train_markdown(records):
    """The training-step tables of ``train_step_bench.py`` records (PyTorch, stock
    ``hvd.DistributedOptimizer``): one per (model, link), every method with its step time,
    spread, first step, hvdcomp's phases, bytes sent and speedups over Horovod fp32/fp16 of the
    same job."""
    records = [r for r in records if r.get("framework", "torch") == "torch"]
    base = _train_base(records)
    out = ["## Training step through the stock hvd.DistributedOptimizer (train_step_bench.py)", "",
           "ms / step: median of the slowest rank's step (zero_grad + forward + backward + step), "
           "min-max in brackets; first: the first step of a fresh optimizer; encode / comm / "
           "decode: hvdcomp's `last_stats.phases` (median over the timed steps of the slowest "
           "rank's), rest: the step minus those (forward, backward, optimizer, Horovod's own "
           "work); MB: sent per rank per step (hvdcomp's counters; * = Horovod's nominal ring "
           "volume); x32 / x16: Horovod fp32's / fp16's step time of the same job over the "
           "method's (>1: faster)."]
    keys = sorted({(r.get("model", "transformer"), r["label"]) for r in records},
                  key=lambda k: (k[0], rate_key(k[1])))
    for model, label in keys:
        rows = sorted((r for r in records if (r.get("model", "transformer"), r["label"])
                       == (model, label)),
                      key=lambda r: ORDER.index(r["method"]) if r["method"] in ORDER else 99)
        some = next((r for r in rows if r["status"] == "ok"), rows[0])
        out += ["", f"### {label}, {MODEL_TITLES.get(model, model)}: "
                    f"{some.get('params', 0) / 1e6:.1f}M parameters in {some.get('tensors')} "
                    f"tensors, {some['ranks']} ranks on {some['hosts']} hosts, compute alone "
                    "(forward + backward, no Horovod) "
                    f"{some.get('compute_seconds', 0) * 1e3:.0f} ms", "",
                "| method | ms / step | first | encode | comm | decode | rest | MB | x32 | x16 |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            if r["status"] != "ok":
                out.append(f"| {r['method']} | {r['status'][:80]} |" + " |" * 8)
                continue
            lo, hi = r.get("spread", [r["seconds"]] * 2)
            ph = [f(r[k] * 1e3, ".0f") if k in r else "" for k in ("encode", "comm", "decode",
                                                                  "rest")]
            star = "*" if r.get("bytes_kind") == "nominal ring" else ""
            out.append(f"| {r['method']} | {r['seconds'] * 1e3:.0f} ({lo * 1e3:.0f}-"
                       f"{hi * 1e3:.0f}) | {r['first_seconds'] * 1e3:.0f} | " + " | ".join(ph)
                       + f" | {r['bytes_per_rank'] / 1e6:.2f}{star} | "
                       f"{f(_train_x(base, r, 'fp32'), '.2f')} | "
                       f"{f(_train_x(base, r, 'fp16'), '.2f')} |")
    return "\n".join(out)


def train_summary(records):
    """One table: every method's speedup over Horovod fp32 (and fp16) per (model, link)."""
    base = _train_base(records)
    cols = sorted({(k[1], k[0]) for k in base}, key=lambda k: (k[0], rate_key(k[1])))
    methods = sorted({k[2] for k in base}, key=lambda m: ORDER.index(m) if m in ORDER else 99)
    out = ["Speedup of the training step over Horovod fp32 / fp16 of the same job (>1: faster).",
           "", "| method | " + " | ".join(f"{MODEL_TITLES.get(m, m)} {label}" for m, label in cols)
           + " |", "| --- |" + " ---: |" * len(cols)]
    for m in (m for m in methods if m != "hvd-fp32"):
        cells = []
        for model, label in cols:
            r = base.get((label, model, m))
            cells.append("" if r is None else f"{f(_train_x(base, r, 'fp32'), '.2f')} / "
                                              f"{f(_train_x(base, r, 'fp16'), '.2f')}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _panels(models, width=5.0):
    """A figure of one panel per model: ``(figure, [(axes, model), ...])``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(models), figsize=(width * len(models), 4.2), squeeze=False)
    return fig, list(zip(axes[0], models))


def _save(fig, title, path):
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def train_plot(records, path):
    """Speedup over Horovod fp32 against the link rate, one panel per model, a line per method."""
    base = _train_base(records)
    fig, panels = _panels(sorted({k[1] for k in base}))
    for ax, model in panels:
        for m in ORDER[1:]:
            pts = sorted((rate_key(k[0]), _train_x(base, r, "fp32")) for k, r in base.items()
                         if k[1] == model and k[2] == m)
            pts = [p for p in pts if p[1] is not None]
            if pts:
                ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.axhline(1.0, color="k", lw=1)
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_xlabel("link (Mbit/s)"), ax.set_ylabel("speedup over Horovod fp32 (log)")
        ax.set_title(f"{MODEL_TITLES.get(model, model)}: training step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, "2 hosts x 2 ranks, emulated links: stock hvd.DistributedOptimizer step", path)


def _regime_jobs(records):
    """{(model, link label): {method: record}}, the jobs of regimes.py, by model and r."""
    jobs = {}
    for r in records:
        jobs.setdefault((r["model"], r["label"]), {})[r["method"]] = r
    return dict(sorted(jobs.items(), key=lambda kv: (
        kv[0][0], kv[1].get("ceiling", {}).get("r", math.inf))))


def _of_ceiling(rec, rounds=False):
    """A configuration's throughput as a fraction of the compute ceiling: the median, or (with
    ``rounds``) each round's. Against the ceiling timed beside it, round by round, where
    regimes.py ran one configuration at a time (``ceiling_rounds``), else the job's."""
    if not rounds:
        return rec["ceiling_seconds"] / rec["seconds"]
    beside = rec.get("ceiling_rounds") or [rec["ceiling_seconds"]] * len(rec["rounds"])
    return [c / s for c, s in zip(beside, rec["rounds"])]


def _decided(rec):
    """What the decision ran at the end: C (every tensor compressed), P (every tensor passed),
    F (every tensor passed in float16), H (the largest tensors compressed), or '' (no decision:
    Horovod's, or a fixed mode)."""
    d = rec.get("decision")
    if not d or d["mode"] != "measure":
        return ""
    if d.get("half"):
        return "F"
    return {d["candidates"][0]: "C", float("inf"): "P"}.get(d["threshold"], "H")


def regimes_markdown(records):
    """Per model and link: r, the ceiling's step, and per configuration its fraction of the
    ceiling, its ratio to the faster of Horovod fp32 and fp16, and the decision's choice."""
    methods = [m for m in ["hvd-fp32", "hvd-fp16", *registry.METHODS]
               if any(r["method"] == m for r in records)]
    head = ["model", "link", "r", "ceiling ms/step", *methods]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, label), job in _regime_jobs(records).items():
        ok = {m: r for m, r in job.items() if r.get("status") == "ok"}
        if "ceiling" not in ok:
            continue
        best = max((_of_ceiling(ok[m]) for m in ("hvd-fp32", "hvd-fp16") if m in ok),
                   default=math.nan)  # a job without Horovod's: no ratio
        cells = []
        for m in methods:
            r = job.get(m)
            if r is None:
                cells.append("")
            elif r.get("status") != "ok":
                cells.append("refused" if "Unsupported" in r["status"] else "error")
            else:
                each, fraction = _of_ceiling(r, rounds=True), _of_ceiling(r)
                ratio = "" if math.isnan(best) else f"({fraction / best:.2f}x) "
                cells.append(f"{fraction:.2f} {ratio}"
                             f"{_decided(r)} [{min(each):.2f}-{max(each):.2f}]".replace("  ", " "))
        lines.append(f"| {model} | {label} | {ok['ceiling']['r']:.2f} | "
                     f"{1e3 * ok['ceiling']['seconds']:.0f} | "
                     + " | ".join(cells) + " |")
    return ("Each cell: throughput as a fraction of the compute ceiling (median of the rounds; "
            "of the ceiling timed beside it where the job ran one configuration at a time), "
            "in brackets the ratio to the faster of Horovod fp32 and fp16 of the same job, the "
            "decision's choice (C: every tensor compressed, H: the largest, P: every tensor "
            "passed, F: every tensor passed in float16), and the range of the rounds' "
            "fractions.\n\n" + "\n".join(lines))


def regimes_plot(records, path):
    """Fraction of the compute ceiling against r, one panel per model, a line per method."""
    jobs = _regime_jobs(records)
    fig, panels = _panels(sorted({k[0] for k in jobs}), 5.5)
    for ax, model in panels:
        for m in ORDER:
            pts = sorted((job["ceiling"]["r"], _of_ceiling(job[m]))
                         for (mo, _), job in jobs.items() if mo == model and "ceiling" in job
                         and job.get(m, {}).get("status") == "ok")
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m, ls="--" if m.startswith("hvd") else "-")
        ax.set_xscale("log"), ax.set_ylim(0, 1.1)
        ax.set_xlabel("r = Horovod fp32 allreduce / compute step")
        ax.set_ylabel("throughput / compute ceiling")
        ax.set_title(f"{model}: stock hvd.DistributedOptimizer")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, "2 hosts x 2 ranks, emulated links (compress-or-pass decision on)", path)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted({r["rate"] for r in rows}, key=rate_key)
    methods = [m for m in ORDER if any(r["method"] == m and r["status"] == "ok" for r in rows)]
    fig, axes = plt.subplots(2, len(rates), figsize=(5 * len(rates), 8.5), squeeze=False)
    styles = {"hvd-fp32": ("k", "o", "-"), "hvd-fp16": ("0.5", "s", "--"),
              "Marsit": ("tab:red", "D", "-"), "BinSGDM": ("tab:blue", "^", "-"),
              "TopK": ("tab:green", "v", "-"), "SketchFusion": ("tab:purple", "P", "-")}
    for j, rate in enumerate(rates):
        ax, bx = axes[0][j], axes[1][j]
        for m in methods:
            pts = sorted((r["elements"], r["ms"], r["speedup_vs_fp32"]) for r in rows
                         if r["rate"] == rate and r["method"] == m and r["status"] == "ok")
            if not pts:
                continue
            c, mk, ls = styles.get(m, (None, "x", "-"))
            xs = [p[0] / 1e6 for p in pts]
            ax.plot(xs, [p[1] for p in pts], color=c, marker=mk, ls=ls, label=m)
            if not m.startswith("hvd-fp32"):
                bx.plot(xs, [p[2] for p in pts], color=c, marker=mk, ls=ls, label=m)
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_title(f"link {rate}: time per allreduce")
        ax.set_xlabel("gradient size (M float32 elements)"), ax.set_ylabel("ms (log)")
        ax.grid(True, which="both", alpha=0.3)
        bx.axhline(1.0, color="k", lw=1)
        bx.set_xscale("log"), bx.set_yscale("log")
        bx.set_title(f"link {rate}: speedup over Horovod fp32 (>1 wins)")
        bx.set_xlabel("gradient size (M float32 elements)"), bx.set_ylabel("x (log)")
        bx.grid(True, which="both", alpha=0.3)
        if j == 0:
            ax.legend(fontsize=8), bx.legend(fontsize=8)
    fig.suptitle("2 hosts x 2 ranks, emulated links (tc tbf): one gradient all-reduce")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


JOBS = [("torch", "optimizer", "PyTorch"), ("tensorflow", "tape", "TF tf.function"),
        ("tensorflow", "keras", "TF Keras fit")]


def _jobs(records):
    """{(label, model, framework, api): {method: record}} of ``tf_vs_torch.sh``'s train.jsonl."""
    jobs = {}
    for r in records:
        key = (r["label"], r.get("model", "transformer"), r.get("framework", "torch"),
               r.get("api", "optimizer"))
        jobs.setdefault(key, {})[r["method"]] = r
    return jobs


def _speedups(job, method):
    """(ms, x vs fp32, x vs fp16) of ``method`` in one job (None where missing)."""
    r = job.get(method)
    if r is None or r["status"] != "ok":
        return None, None, None
    x = [job[b]["seconds"] / r["seconds"] if job.get(b, {}).get("status") == "ok" else None
         for b in ("hvd-fp32", "hvd-fp16")]
    return r["seconds"] * 1e3, x[0], x[1]


def tf_vs_torch_markdown(records):
    """One table per (link, model): every method's step time and speedups in each framework/API,
    and TensorFlow's step time over PyTorch's."""
    jobs = _jobs(records)
    out = ["## TensorFlow beside PyTorch: training step through the stock Horovod APIs "
           "(tf_vs_torch.sh)", "",
           "ms: median of the slowest rank's step time; x32 / x16: Horovod fp32's / fp16's step "
           "time of the same job over the method's (>1: faster); TF/PT: the TF tf.function "
           "step over the PyTorch step."]
    for label, model in sorted({(k[0], k[1]) for k in jobs}, key=lambda k: (rate_key(k[0]), k[1])):
        present = [(fw, api, title) for fw, api, title in JOBS if (label, model, fw, api) in jobs]
        some = next(iter(jobs[(label, model) + present[0][:2]].values()))
        compute = {title: next(iter(jobs[(label, model, fw, api)].values()))["compute_seconds"]
                   for fw, api, title in present[:2]}
        computes = ", ".join(f"{title} {s * 1e3:.0f} ms" for title, s in compute.items())
        out += ["", f"### {label}, {model}: {some['params'] / 1e6:.1f}M parameters in "
                    f"{some['tensors']} tensors, {some['ranks']} ranks on {some['hosts']} hosts "
                    f"(compute alone, no Horovod: {computes})", ""]
        head = "| method | " + " | ".join(f"{t} ms | x32 | x16" for _, _, t in present)
        out += [head + " | TF/PT |", "|" + " --- |" * (2 + 3 * len(present))]
        methods = sorted({m for fw, api, _ in present for m in jobs[(label, model, fw, api)]},
                         key=lambda m: ORDER.index(m) if m in ORDER else 99)
        for m in methods:
            cells, ms = [], {}
            for fw, api, _ in present:
                t, x32, x16 = _speedups(jobs[(label, model, fw, api)], m)
                ms[(fw, api)] = t
                cells += [f(t, ".0f"), f(x32, ".2f"), f(x16, ".2f")]
            pt, tf_ = ms.get(("torch", "optimizer")), ms.get(("tensorflow", "tape"))
            ratio = tf_ / pt if pt and tf_ else None
            out.append(f"| {m} | " + " | ".join(cells) + f" | {f(ratio, '.2f')} |")
    return "\n".join(out)


def tf_vs_torch_plot(records, path):
    """Speedup over Horovod fp32 per method, one panel per (link, model), a bar per job."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    jobs = _jobs(records)
    panels = sorted({(k[0], k[1]) for k in jobs}, key=lambda k: (rate_key(k[0]), k[1]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (label, model) in zip(axes[0], panels):
        present = [(fw, api, t) for fw, api, t in JOBS if (label, model, fw, api) in jobs]
        methods = [m for m in ORDER[1:] if any(m in jobs[(label, model, fw, api)]
                                               for fw, api, _ in present)]
        width = 0.8 / len(present)
        for i, (fw, api, title) in enumerate(present):
            xs = [_speedups(jobs[(label, model, fw, api)], m)[1] or 0 for m in methods]
            ax.bar([j + i * width for j in range(len(methods))], xs, width, label=title)
        ax.axhline(1.0, color="k", lw=1)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(methods))])
        ax.set_xticklabels(methods, rotation=30, fontsize=8)
        ax.set_title(f"{label}, {model}: speedup over Horovod fp32")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# mode -> (records file, output name (.md and .png), markdown of the records, plot)
REPORTS = {
    "--train": ("train.jsonl", "train_matrix",
                lambda r: train_summary(r) + "\n\n" + train_markdown(r), train_plot),
    "--tf-vs-torch": ("train.jsonl", "tf_vs_torch", tf_vs_torch_markdown, tf_vs_torch_plot),
    "--regimes": ("regimes.jsonl", "regimes", regimes_markdown, regimes_plot),
}


def main():
    if sys.argv[1] in REPORTS:
        source, name, markdown_of, plot_of = REPORTS[sys.argv[1]]
        folder = sys.argv[2]
        records = load(os.path.join(folder, source))
        md = markdown_of(records)
        with open(os.path.join(folder, name + ".md"), "w") as fh:
            fh.write(md + "\n")
        plot_of(records, os.path.join(folder, name + ".png"))
        print(md)
        return
    folder = sys.argv[1]
    records = load(os.path.join(folder, "raw.jsonl"))
    probes = {}
    pp = os.path.join(folder, "netprobe.jsonl")
    if os.path.exists(pp):
        for p in load(pp):
            probes[p["label"]] = p
    rows = rows_of(records)
    md = markdown(rows, probes)
    tp = os.path.join(folder, "train.jsonl")
    if os.path.exists(tp):
        md += "\n\n" + train_markdown(load(tp))
    with open(os.path.join(folder, "table.md"), "w") as fh:
        fh.write(md + "\n")
    with open(os.path.join(folder, "results.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in COLS})
    plot(rows, os.path.join(folder, "allreduce.png"))
    print(md)
    print(f"\nwrote {folder}/table.md, results.csv, allreduce.png")


if __name__ == "__main__":
    main()
