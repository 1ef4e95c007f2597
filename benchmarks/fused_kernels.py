"""Encode + decode of one tensor, fused kernels (``hvdcomp.kernels``) against the NumPy
reference path, as multiples of one memory copy of the same buffer (single process, CPU).

    .venv/bin/python benchmarks/fused_kernels.py [--n 25000000] [--repeat 5] [--no-compile]

Per method (Marsit 'hybrid', the default and the costliest variant; TopK, ratio 0.01, steady
state: a memory exists), what one step does to one tensor on this rank, minus the
communication: encode (compensate, l1 scale, pack / compensate, select) and decode (step and
memory / dense step and residual), the step's output array allocated as the methods do. Printed:
median and min-max over ``--repeat`` runs, in ms and in units of the median ``np.copyto`` of
the n-element float32 buffer, measured in the same run. Issue #18's target: at most 6 memcpys
for encode + decode. Then the numba compile time (first call, empty cache, a fresh process) and
the load time from numba's disk cache (a second process).

Measured (2 shared cores, load 0.3; memcpy 10.0 ms): Marsit hybrid 139.9 ms (13.9x) reference,
36.0 ms (3.6x) fused; TopK 1% 63.8 ms (6.4x) reference, 44.5 ms (4.4x) fused. numba: compile
3.1 s (empty cache), 0.47 s from the disk cache, import 0.7 s.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hvdcomp.signs import merge as alg  # noqa: E402
from hvdcomp.backend import pack_signs  # noqa: E402
from hvdcomp.backend import topk as sel  # noqa: E402

SHARE = alg.LOCAL_SHARE["hybrid"]


def marsit_reference(g, e, p, merged, scratch):
    np.add(g, e, out=p)
    s = alg.l1_scale(p)
    pack_signs(p)
    local = alg.own_message(p, SHARE * s, out=scratch)
    return alg.apply(alg.decode(merged, p.size), 0.5, p, True, SHARE, local)


def marsit_fused(g, e, p, merged, bits):
    from hvdcomp.signs import kernels as signs
    s = alg.l1_scale(p, total=signs.encode(g, e, p, bits))
    step = np.empty_like(p)
    signs.marsit_decode(merged, p, 0.5, alg.memory_factor(0.5, SHARE), SHARE * s, step, p)
    return step, p


def topk_decode(a, idx, val):
    step = np.zeros_like(a)
    step[idx] = val  # the applied values (here: all sent values won)
    a[idx] = 0  # the residual, in place
    return step, a


def topk_reference(g, e, out, k):
    np.add(g, e, out=out)
    idx, val = sel.select_topk(out, k, "approx", seed=3)
    return topk_decode(out, idx, val)


def topk_fused(g, e, out, k):
    from hvdcomp.kernels.topk import SumSource
    idx, val = sel.select_topk(SumSource(g, e, out, 2 * k + 64), k, "approx", seed=3)
    return topk_decode(out, idx, val)


def timed(fn, repeat):
    fn()  # warm-up (compiles or loads the kernels)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return np.median(ts), min(ts), max(ts)


COMPILE_SNIPPET = """
import time, numpy as np
t0 = time.perf_counter()
from hvdcomp.kernels import topk
from hvdcomp.signs import kernels as signs
t1 = time.perf_counter()
g = np.ones(1000, np.float32); p = np.empty_like(g); b = np.empty(125, np.uint8)
signs.encode(g, g, p, b); signs.marsit_decode(b, p, 1.0, 0.9, 0.1, p.copy(), p)
signs.marsit_decode(b, p, 1.0, 1.0, None, p.copy(), p)
signs.vote_decode(b.reshape(1, -1), 0, p, 1.0, 1.0, p.copy(), p)
topk._sum_scan(g, g, p, np.float32(1.0), np.empty(8, np.int64))
print(f"{t1 - t0:.3f} {time.perf_counter() - t1:.3f}")
"""


def compile_times():
    """(import s, first calls s) in a fresh process with an empty cache, then with it warm."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT)
        runs = [subprocess.run([sys.executable, "-c", COMPILE_SNIPPET], env=env, check=True,
                               capture_output=True, text=True).stdout.split()
                for _ in range(2)]
    return [tuple(float(x) for x in r) for r in runs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    n, rep = args.n, args.repeat
    rng = np.random.default_rng(0)
    g = rng.standard_normal(n, dtype=np.float32)
    e = (0.1 * rng.standard_normal(n)).astype(np.float32)
    merged = pack_signs(rng.standard_normal(n, dtype=np.float32))
    p, dst, scratch = np.empty_like(g), np.empty_like(g), np.empty_like(g)
    bits = np.empty_like(merged)
    k = n // 100
    copy = timed(lambda: np.copyto(dst, g), rep)
    rows = [("Marsit hybrid", "reference", timed(lambda: marsit_reference(g, e, p, merged,
                                                                          scratch), rep)),
            ("Marsit hybrid", "fused", timed(lambda: marsit_fused(g, e, p, merged, bits), rep)),
            ("TopK 1%", "reference", timed(lambda: topk_reference(g, e, p, k), rep)),
            ("TopK 1%", "fused", timed(lambda: topk_fused(g, e, p, k), rep))]
    print(f"n = {n:,} float32, {rep} repeats, single process ({os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}); memcpy median {copy[0] * 1e3:.1f} ms "
          f"(min-max {copy[1] * 1e3:.1f}-{copy[2] * 1e3:.1f})\n")
    print("| method | path | encode+decode ms, median (min-max) | x memcpy, median (min-max) |")
    print("| --- | --- | ---: | ---: |")
    for name, path, (med, lo, hi) in rows:
        print(f"| {name} | {path} | {med * 1e3:.1f} ({lo * 1e3:.1f}-{hi * 1e3:.1f}) | "
              f"{med / copy[0]:.2f} ({lo / copy[0]:.2f}-{hi / copy[0]:.2f}) |")
    if not args.no_compile:
        (imp0, first0), (imp1, first1) = compile_times()
        print(f"\nnumba: import of hvdcomp.kernels {imp0:.2f} s; first calls of every kernel "
              f"(float32): compile {first0:.2f} s with an empty cache, {first1:.2f} s loaded "
              f"from the disk cache (import {imp1:.2f} s)")


if __name__ == "__main__":
    main()
