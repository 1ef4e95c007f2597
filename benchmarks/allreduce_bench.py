"""Rank script: time one gradient all-reduce per method on the emulated cluster, in one job.

Launched by ``benchmarks/run_bench.sh`` through ``benchmarks/cluster.sh run`` (one job per link
rate); runs on any MPI launch too (then the link counters are absent). For every gradient size
and every method, every rank draws its own N(0, 1) float32 gradient (torch, CPU) and calls

    hvd.allreduce(grad, name=..., op=hvd.Average, compression=C)

with C = hvd.Compression.none ("hvd-fp32"), hvd.Compression.fp16 ("hvd-fp16") or a fresh hvdcomp
compressor instance (by default every method of hvdcomp/registry.py; default settings). hvdcomp
compressors take this exact path in training (compress -> Horovod placeholder -> decompress), so
the time is what a training step pays.

Per (size, method): ``--warmup`` calls, then ``--reps`` timed calls, each preceded by a barrier;
a call's time is the slowest rank's, the figure is the median over the calls. Also recorded:
encode/comm/decode seconds from ``compressor.last_stats.phases`` (median over calls of the
slowest rank), hvdcomp's bytes sent per rank (mean over ranks, metadata included; for Horovod
the nominal ring volume 2 (P-1)/P * n * itemsize), and the bytes that really left each emulated
host on its link (``/sys/class/net/$HVDC_CLUSTER_IFACE/statistics/tx_bytes`` read by each host's
local rank 0 around the timed calls, divided by the calls; includes barriers and Horovod's
negotiation). Rank 0 appends one JSON object per line to ``--out``.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

from mpi4py import MPI  # before Horovod: THREAD_MULTIPLE (see DESIGN.md)

import numpy as np
import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdcomp  # noqa: E402,F401

from methods import ALL_METHODS, make_compression  # noqa: E402  this script's folder


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def link_tx():
    iface = os.environ.get("HVDC_CLUSTER_IFACE")
    if not iface:
        return None
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M,5M,25M")
    ap.add_argument("--columns", type=int, default=0,
                    help="shape each gradient (size / columns, columns), a weight matrix as "
                         "PowerSGD sees one; 0: a vector (PowerSGD then sends it whole)")
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="fewer timed calls for a (size, method) whose warm-up call took longer "
                         "than this / reps (never fewer than 1); 0: always --reps")
    ap.add_argument("--label", default="", help="e.g. the link rate; copied into every record")
    ap.add_argument("--rate-bps", type=float, default=0, help="the shaped link rate, bits/s")
    ap.add_argument("--measured-bps", type=float, default=0, help="netprobe's TCP rate, bits/s")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = hvd.rank(), hvd.size()
    local_rank, local_size, cross_size = hvd.local_rank(), hvd.local_size(), hvd.cross_size()
    hosts = comm.allgather(socket.gethostname())
    torch.set_num_threads(1)
    if rank == 0:
        print(f"# {size} ranks on hosts {hosts} (local_size {local_size}, cross_size "
              f"{cross_size}), label {args.label!r}", flush=True)

    out = open(args.out, "a") if (args.out and rank == 0) else None
    for n in [parse_size(s) for s in args.sizes.split(",")]:
        gen = torch.Generator().manual_seed(1000 + rank)
        grad = torch.randn(n, generator=gen, dtype=torch.float32)
        if args.columns:
            grad = grad[:n - n % args.columns].reshape(-1, args.columns)
        for method in args.methods.split(","):
            try:
                comp = make_compression(method, hvd)
            except Exception as exc:  # noqa: BLE001 - an unavailable method is reported, not fatal
                comp, err = None, f"{type(exc).__name__}: {exc}"
            name = f"{method}.{n}"
            times, phases, sent = [], [], []
            status, tx = "ok", None
            reps = args.reps
            try:
                if comp is None:
                    raise RuntimeError(err)
                for i in range(args.warmup + reps):
                    if i == args.warmup:
                        comm.Barrier()
                        tx0 = link_tx()
                    comm.Barrier()
                    t0 = time.perf_counter()
                    res = hvd.allreduce(grad, name=name, op=hvd.Average, compression=comp)
                    dt = time.perf_counter() - t0
                    dt = comm.allreduce(dt, op=MPI.MAX)
                    if i == 0 and args.max_seconds and dt * reps > args.max_seconds:
                        reps = max(1, int(args.max_seconds // dt))
                    if i >= args.warmup:
                        times.append(dt)
                        st = getattr(comp, "last_stats", None)
                        if st is not None:
                            ph = {k: comm.allreduce(st.phases.get(k, 0.0), op=MPI.MAX)
                                  for k in ("encode", "comm", "decode")}
                            phases.append(ph)
                            sent.append(comm.allreduce(st.bytes_sent, op=MPI.SUM) / size)
                    if i >= args.warmup + reps - 1:
                        break
                tx1 = link_tx()
                assert res.shape == grad.shape and bool(torch.isfinite(res).all())
                mine = (tx1 - tx0) if (local_rank == 0 and tx0 is not None) else None
                per_host = [v for v in comm.allgather(mine) if v is not None]
                tx = statistics.mean(per_host) / len(times) if per_host else None
            except NotImplementedError as exc:
                status = f"unavailable: {exc}"
            except Exception as exc:  # noqa: BLE001
                status = f"error: {type(exc).__name__}: {exc}"
            # every rank reached the same point (all raise alike, or none): keep them in step
            comm.Barrier()
            rec = {"label": args.label, "rate_bps": args.rate_bps,
                   "measured_bps": args.measured_bps, "ranks": size, "hosts": cross_size,
                   "ranks_per_host": local_size, "elements": n, "method": method,
                   "status": status, "reps": len(times)}
            if status == "ok":
                rec["seconds"] = statistics.median(times)
                rec["seconds_all"] = times
                if phases:
                    for k in ("encode", "comm", "decode"):
                        rec[k] = statistics.median(p[k] for p in phases)
                    rec["bytes_per_rank"] = statistics.median(sent)
                    rec["bytes_kind"] = "measured (hvdcomp)"
                else:
                    item = 2 if method == "hvd-fp16" else 4
                    rec["bytes_per_rank"] = 2 * (size - 1) / size * n * item
                    rec["bytes_kind"] = "nominal ring"
                rec["link_bytes_per_host"] = tx
            if rank == 0:
                msg = (f"{args.label:>8} n={n:>9} {method:<13} "
                       + (f"{rec['seconds']*1e3:9.1f} ms  " if status == "ok" else status[:100]))
                if status == "ok" and "encode" in rec:
                    msg += f"enc {rec['encode']*1e3:.1f} comm {rec['comm']*1e3:.1f} dec {rec['decode']*1e3:.1f} ms"
                print(msg, flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
            del comp
        del grad
    if out:
        out.close()


if __name__ == "__main__":
    main()
