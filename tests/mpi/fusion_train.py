"""Rank script: LayerFusion (``fusion='auto'``) through the stock hvd.DistributedOptimizer (SGD)
on the digits MLP: bit-identical ranks after every step, the plan after each of the first steps
(rule and buckets, to compare across ranks), and the final accuracy. Args: one or more cases of
four each, ``compression epochs lr momentum`` (names from torch_common.compression_for, e.g.
'marsit-auto'), run one after the other in this launch; each reports with ``case=compression``."""
import sys

import horovod.torch as hvd

from report import cases, report
from torch_common import (build, compression_for, evaluate, load_digits_split, rank_shard,
                          train)

hvd.init()
(xtr, ytr), (xte, yte) = load_digits_split(0)
xtr, ytr = rank_shard(xtr, ytr)
for name, epochs, lr, momentum in cases(sys.argv[1:], 4):
    comp = compression_for(name)
    model, opt = build(comp, float(lr), float(momentum))
    steps = int(epochs) * (len(xtr) // 32)
    plans, identical = [], 0
    for step in range(4):  # the plan as it evolves over the first steps
        identical += train(model, opt, xtr, ytr, step, step + 1)
        plans.append(comp.fusion_plan)
    identical += train(model, opt, xtr, ytr, 4, steps)
    acc, loss = evaluate(model, xte, yte)
    report(case=name, rank=hvd.rank(), steps=steps, identical_steps=identical, acc=acc,
           loss=loss, plans=plans, plan=comp.fusion_plan, describe=comp.describe_fusion(),
           step=comp.state_dict()["step"], stats=comp.total_stats.as_dict(),
           memory_keys=sorted(comp.state_dict()["state"]))
