"""The table of ``ddp_regimes.py``'s records (a regimes.jsonl): per model and link, r and each
configuration's throughput as a fraction of the compute ceiling, with in brackets its multiple
of the best of DDP's all-reduce, its fp16 hook and PyTorch's PowerSGD hook (rank 1 or 4) in the
same job, and the spread of its rounds.

    python benchmarks/ddp_report.py results/ddp-regimes-.../regimes.jsonl
"""
import json
import sys

PEERS = ("ddp", "ddp-fp16", "powersgd-1", "powersgd-4")


def main(path):
    jobs = {}
    for line in open(path):
        rec = json.loads(line)
        if rec.get("status") == "ok":
            jobs.setdefault((rec["model"], rec["label"]), {})[rec["method"]] = rec
    for (model, label), recs in jobs.items():
        ceiling = recs.get("ceiling")
        best = min((recs[p]["seconds"] for p in PEERS if p in recs), default=float("nan"))
        r = next(iter(recs.values()))["r"]
        print(f"\n{model} at {label} (r {r:.2f}; ceiling "
              f"{ceiling['seconds'] * 1e3:.0f} ms/step)\n")
        print("| configuration | ms/step | rounds | of the ceiling | x the best of DDP's |")
        print("|---|---|---|---|---|")
        for method, rec in recs.items():
            own = rec["ceiling_seconds"]
            spread = ", ".join(f"{s * 1e3:.0f}" for s in rec["rounds"])
            print(f"| {method} | {rec['seconds'] * 1e3:.0f} | {spread} | "
                  f"{own / rec['seconds']:.2f} | {best / rec['seconds']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
