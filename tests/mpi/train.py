"""Rank script: train the digits MLP with the stock hvd.DistributedOptimizer (SGD) and a named
compression (see torch_common.compression_for), checking after every step that all ranks hold
bit-identical parameters. Args: one or more cases of four each, ``compression epochs lr
momentum``, run one after the other in this launch; each reports with
``case='<compression>-<epochs>'``."""
import sys

import horovod.torch as hvd

from hvdcomp.hierarchical import node_layout
from report import cases, report
from torch_common import (build, compression_for, compressor_object, evaluate,
                          load_digits_split, rank_shard, train)


def train_case(name, epochs, lr, momentum, xtr, ytr, xte, yte):
    """The fields one case reports (see the module docstring)."""
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
    return dict(steps=steps, identical_steps=identical, acc=acc, loss=loss,
                stats=comp.total_stats.as_dict() if comp else None,
                memory_keys=sorted(comp.state_dict()["state"]) if comp else None, **extra)


hvd.init()
(xtr, ytr), (xte, yte) = load_digits_split(0)
xtr, ytr = rank_shard(xtr, ytr)
for name, epochs, lr, momentum in cases(sys.argv[1:], 4):
    report(case=f"{name}-{epochs}", rank=hvd.rank(),
           **train_case(name, int(epochs), float(lr), float(momentum), xtr, ytr, xte, yte))
