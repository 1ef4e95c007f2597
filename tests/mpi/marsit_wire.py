"""Rank script: wire volume and time split of Marsit for one large fp32 gradient, next to a plain
fp32 ring all-reduce of the same buffer measured in the same run. Arg: number of elements."""
import sys
import time

import numpy as np
import torch
import horovod.torch as hvd

import hvdcomp
from hvdcomp.comm import get_context, ring_allreduce
from report import report

n = int(sys.argv[1])
hvd.init()
torch.set_num_threads(1)
g = torch.randn(n, generator=torch.Generator().manual_seed(hvd.rank()))
comp = hvdcomp.Marsit()
out = hvd.allreduce(g, name="big", compression=comp)  # warm-up step
out = hvd.allreduce(g, name="big", compression=comp)
marsit = comp.last_stats

ctx = get_context()
before = ctx.stats.snapshot()
t0 = time.perf_counter()
dense = ring_allreduce(ctx, g.numpy().copy())
dense_s = time.perf_counter() - t0
fp32 = ctx.stats.since(before)
report(rank=hvd.rank(), n=n, marsit_sent=marsit.bytes_sent, marsit_recv=marsit.bytes_recv,
       fp32_sent=fp32.bytes_sent, ratio=fp32.bytes_sent / marsit.bytes_sent,
       phases=marsit.phases, marsit_s=marsit.seconds, fp32_ring_s=dense_s,
       out_values=sorted(set(np.round(np.abs(out.numpy()), 6).tolist()))[:3])
