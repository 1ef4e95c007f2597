"""Micro-benchmarks of hvdcomp's backend kernels, in elements per second, next to a memory copy
of the same float32 buffer measured in the same run (single process, NumPy on CPU).

    .venv/bin/python benchmarks/kernels.py [--n 25000000] [--repeat 3] [--csv results/kernels.csv]

Each figure is the best of ``--repeat`` runs (the machine is shared: best-of is the least noisy
estimate of what the kernel costs). Kernels:
- memcpy: ``np.copyto`` of the n-element float32 buffer (the yardstick: 8 bytes moved per element);
- pack_signs: n float32 -> n/8 bytes; unpack_signs: n/8 bytes -> n float32 (+-1);
- Marsit merge, per element (8 per byte): the Bernoulli mask (``bernoulli_mask``) at p = 1/2 (one
  random word per 64 elements) and at p = 1/3 (24 binary digits: 24 words), ``merge_bits`` alone,
  and one hop as Marsit runs it (mask at p = 1/2 + merge);
- top-k selection of k = n/100: the sampled-threshold
  ``topk_approx`` and the exact ``topk_exact``;
- Count-Sketch, 5 rows x (10 * n/100) columns: ``sketch``
  of the n-vector, and ``heavy_hitters`` (unsketch + top-k of n/100) of the table.
"""
import argparse
import csv
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdcomp.backend import bits, masks, topk  # noqa: E402
from hvdcomp.methods.sketchfusion import sketch as sk  # noqa: E402


def best(fn, repeat):
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    n, rep = args.n, args.repeat
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    dst = np.empty_like(x)
    nbytes = bits.packed_nbytes(n)
    packed = bits.pack_signs(x)
    own = bits.pack_signs(rng.standard_normal(n, dtype=np.float32))
    half = masks.bernoulli_mask((0, 1, 2, 3), nbytes, 0.5)

    rows = []

    def add(name, fn, note=""):
        t = best(fn, rep)
        rows.append({"kernel": name, "seconds": t, "elements_per_s": n / t, "note": note})

    add("memcpy (np.copyto float32)", lambda: np.copyto(dst, x), "8 bytes moved per element")
    add("pack_signs", lambda: bits.pack_signs(x))
    add("unpack_signs", lambda: bits.unpack_signs(packed, n))
    add("bernoulli_mask p=1/2", lambda: masks.bernoulli_mask((0, 1, 2, 3), nbytes, 0.5))
    add("bernoulli_mask p=1/3", lambda: masks.bernoulli_mask((0, 1, 2, 3), nbytes, 1 / 3),
        "24 binary digits: worst case")
    add("merge_bits", lambda: bits.merge_bits(packed, own, half))
    add("Marsit hop (mask 1/2 + merge)",
        lambda: bits.merge_bits(packed, own, masks.bernoulli_mask((0, 1, 2, 3), nbytes, 0.5)))

    k = max(1, n // 100)
    add("topk_approx k=n/100", lambda: topk.topk_approx(x, k), "sampled threshold")
    add("topk_exact k=n/100", lambda: topk.topk_exact(x, k))
    h = sk.hashes(n, 5, 10 * k, seed=0)
    table = sk.sketch(x, h)
    add("count sketch 5 x 10k", lambda: sk.sketch(x, h), "5 slice-add passes over x")
    add("heavy_hitters (unsketch + top-k)", lambda: sk.heavy_hitters(table, h, k))

    copy = rows[0]["elements_per_s"]
    print(f"n = {n:,} float32 elements, best of {rep}, single process "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})\n")
    print("| kernel | ms | M elements/s | vs memcpy | note |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        r["vs_memcpy"] = r["elements_per_s"] / copy
        print(f"| {r['kernel']} | {r['seconds']*1e3:.1f} | {r['elements_per_s']/1e6:.0f} | "
              f"{r['vs_memcpy']:.2f} | {r['note']} |")
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["kernel", "seconds", "elements_per_s", "vs_memcpy",
                                              "note"])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
