"""The table of ``first_steps.jsonl`` (``benchmarks/first_steps.sh``): per link and round, each
configuration's median of steps 2-6 and 51-60, their ratio, and the ratios of Horovod fp32's and
fp16's times to its own (> 1: faster than Horovod) for steps 2-6, 51-60 and 11-14 (Horovod's
synthetic benchmark's timed batches after its 10 warm-up ones).

    .venv/bin/python benchmarks/first_steps_report.py results/.../first_steps.jsonl
"""
import collections
import json
import sys


def cell(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def main(path):
    by = collections.defaultdict(dict)
    for line in open(path):
        r = json.loads(line)
        by[(r["label"], r["round"])][r["method"]] = r
    print("| link | method | steps 2-6 (s) | 51-60 (s) | 2-6 / 51-60 | 2-6 vs fp32 | 2-6 vs fp16 "
          "| 51-60 vs fp32 | 11-14 vs fp16 | not run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (label, rnd), runs in sorted(by.items()):
        base32, base16 = runs.get("hvd-fp32", {}), runs.get("hvd-fp16", {})
        for method, r in runs.items():
            def ratio(base, key):
                return f"{base[key] / r[key]:.2f}x" if base.get(key) and r.get(key) else "-"
            own = r["first"] / r["steady"] if r.get("steady") else None
            print(f"| {label} ({rnd}) | {method} | {cell(r['first'])} | {cell(r.get('steady'))} | "
                  f"{cell(own, 2)} | {ratio(base32, 'first')} | {ratio(base16, 'first')} | "
                  f"{ratio(base32, 'steady')} | {ratio(base16, 'benchmark')} | "
                  f"{', '.join(r.get('not_run') or []) or '-'} |")


if __name__ == "__main__":
    main(sys.argv[1])
