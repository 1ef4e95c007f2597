"""Rank script: time one gradient all-reduce per method on the emulated cluster, in one job.

Launched by ``benchmarks/run_bench.sh`` through ``benchmarks/cluster.sh run`` (one job per link
rate); runs on any MPI launch too (then the link counters are absent). For every gradient size
and every method, every rank draws its own N(0, 1) float32 gradient (torch, CPU) and calls

    hvd.allreduce(grad, name=..., op=hvd.Average, compression=C)

with C = hvd.Compression.none ("hvd-fp32"), hvd.Compression.fp16 ("hvd-fp16") or a fresh hvdcomp
compressor instance (by default every method of hvdcomp/registry.py; default settings). hvdcomp
compressors take this exact path in training (compress -> Horovod placeholder -> decompress), so
the time is what a training step pays.

Per size: every method's ``--warmup`` calls, then ``--reps`` rounds of one timed call per method
(interleaved, so that the machine's drift over the run spreads over every method instead of
landing on one method's block of calls), each preceded by a barrier; a call's time is the
slowest rank's, the figure is the median over the calls. Also recorded:
encode/comm/decode seconds from ``compressor.last_stats.phases`` (median over calls of the
slowest rank), hvdcomp's bytes sent per rank (mean over ranks, metadata included; for Horovod
the nominal ring volume 2 (P-1)/P * n * itemsize), and the bytes that really left each emulated
host on its link (``/sys/class/net/$HVDC_CLUSTER_IFACE/statistics/tx_bytes`` read by each host's
local rank 0 around each timed call, the mean over the calls; includes barriers and Horovod's
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
        runs = [Run(method, n, grad, comm, args.reps) for method in args.methods.split(",")]
        for run in runs:  # warm-up, method by method; sets each one's number of timed calls
            for _ in range(args.warmup):
                run.call(timed=False, max_seconds=args.max_seconds, reps=args.reps)
        for i in range(args.reps):  # interleaved: call i of every method, then call i + 1
            for run in runs:
                if i < run.reps:
                    run.call(timed=True)
        for run in runs:
            rec = run.record(args, size, cross_size, local_size)
            if rank == 0:
                print(run.line(args.label, rec), flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
        del runs, grad
    if out:
        out.close()


class Run:
    """One method's calls for one gradient: ``call`` (a barrier, one allreduce, the slowest
    rank's time, the phases, the bytes hvdcomp sent and those that left the host's link);
    ``record``: the JSON record (medians over the timed calls). An error in a call marks the
    method failed on every rank alike (all raise, or none), and its later calls are skipped."""

    def __init__(self, method, n, grad, comm, reps):
        self.method, self.n, self.grad, self.comm = method, n, grad, comm
        self.name, self.reps, self.status = f"{method}.{n}", reps, "ok"
        self.times, self.phases, self.sent, self.tx = [], [], [], []
        try:
            self.comp = make_compression(method, hvd)
        except Exception as exc:  # noqa: BLE001 - an unavailable method is reported, not fatal
            self.comp, self.status = None, f"error: {type(exc).__name__}: {exc}"

    def call(self, timed, max_seconds=0, reps=0):
        if self.status != "ok":
            return
        comm = self.comm
        try:
            comm.Barrier()
            tx0 = link_tx()
            comm.Barrier()
            t0 = time.perf_counter()
            res = hvd.allreduce(self.grad, name=self.name, op=hvd.Average,
                                compression=self.comp)
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            comm.Barrier()
            tx1 = link_tx()
            assert res.shape == self.grad.shape and bool(torch.isfinite(res).all())
        except NotImplementedError as exc:
            self.status = f"unavailable: {exc}"
        except Exception as exc:  # noqa: BLE001
            self.status = f"error: {type(exc).__name__}: {exc}"
        comm.Barrier()  # every rank reached the same point: keep them in step
        if self.status != "ok":
            return
        if not timed:
            self.reps = (max(1, min(reps, int(max_seconds // dt)))
                         if max_seconds and dt * reps > max_seconds else reps)
            return
        self.times.append(dt)
        st = getattr(self.comp, "last_stats", None)
        if st is not None:
            self.phases.append({k: comm.allreduce(st.phases.get(k, 0.0), op=MPI.MAX)
                                for k in ("encode", "comm", "decode")})
            self.sent.append(comm.allreduce(st.bytes_sent, op=MPI.SUM) / comm.size)
        mine = (tx1 - tx0) if (hvd.local_rank() == 0 and tx0 is not None) else None
        per_host = [v for v in comm.allgather(mine) if v is not None]
        if per_host:
            self.tx.append(statistics.mean(per_host))

    def record(self, args, size, cross_size, local_size):
        rec = {"label": args.label, "rate_bps": args.rate_bps,
               "measured_bps": args.measured_bps, "ranks": size, "hosts": cross_size,
               "ranks_per_host": local_size, "elements": self.n, "method": self.method,
               "status": self.status, "reps": len(self.times), "interleaved": True,
               "columns": args.columns}
        if self.status != "ok" or not self.times:
            rec["status"] = self.status if self.status != "ok" else "error: no timed call"
            return rec
        rec["seconds"] = statistics.median(self.times)
        rec["seconds_all"] = self.times
        if self.phases:
            for k in ("encode", "comm", "decode"):
                rec[k] = statistics.median(p[k] for p in self.phases)
            rec["bytes_per_rank"] = statistics.median(self.sent)
            rec["bytes_kind"] = "measured (hvdcomp)"
        else:
            item = 2 if self.method == "hvd-fp16" else 4
            rec["bytes_per_rank"] = 2 * (size - 1) / size * self.n * item
            rec["bytes_kind"] = "nominal ring"
        rec["link_bytes_per_host"] = statistics.mean(self.tx) if self.tx else None
        return rec

    def line(self, label, rec):
        msg = (f"{label:>8} n={self.n:>9} {self.method:<13} "
               + (f"{rec['seconds']*1e3:9.1f} ms  " if rec["status"] == "ok"
                  else rec["status"][:100]))
        if rec["status"] == "ok" and "encode" in rec:
            msg += (f"enc {rec['encode']*1e3:.1f} comm {rec['comm']*1e3:.1f} "
                    f"dec {rec['decode']*1e3:.1f} ms")
        return msg


if __name__ == "__main__":
    main()
