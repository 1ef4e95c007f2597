"""Rank script: train the digits MLP with the stock hvd.DistributedOptimizer (SGD) and a named
compression (see torch_common.compression_for), checking after every step that all ranks hold
bit-identical parameters. Args: compression epochs lr momentum."""
import sys

import horovod.torch as hvd

from hvdcomp.hierarchical import node_layout
from report import report
from torch_common import (build, compression_for, compressor_object, evaluate,
                          load_digits_split, rank_shard, train)

name, epochs, lr, momentum = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
hvd.init()
(xtr, ytr), (xte, yte) = load_digits_split(0)
xtr, ytr = rank_shard(xtr, ytr)
compression = compression_for(name)
model, opt = build(compression, lr, momentum)
steps = epochs * (len(xtr) // 32)
identical = train(model, opt, xtr, ytr, 0, steps)
acc, loss = evaluate(model, xte, yte)
comp = compressor_object(compression)
extra = {}
if getattr(comp, "last_legs", None):  # node stages: bytes per leg of the last step
    extra = dict(legs={k: v.bytes_sent for k, v in comp.last_legs.items()},
                 layout=node_layout(comp), elements=comp.last_stats.elements,
                 compressed=comp.last_stats.compressed_elements)
report(rank=hvd.rank(), steps=steps, identical_steps=identical, acc=acc, loss=loss,
       stats=comp.total_stats.as_dict() if comp else None,
       memory_keys=sorted(comp.state_dict()["state"]) if comp else None, **extra)
