"""Rank script (2 ranks): quiet steps (``hvdcomp.engine.StepEngine._quiet``). The digits MLP
trains 70 steps through the stock hvd.DistributedOptimizer (SGD) under Horovod's own
``Compression.none``, then under ``Marsit(decision='pass')`` (every tensor left to Horovod) and
``Marsit(decision='pass', on_nonfinite='skip')`` (hvdcomp must see every step's statuses).
Reports per run the bytes hvdcomp itself sent at each step (``last_stats.bytes_sent``), whether
the ranks stayed identical, and the final parameters' digest."""
import hvdcomp
import horovod.torch as hvd

from report import report
from torch_common import build, compressor_object, digest, load_digits_split, train

hvd.init()
(x, y), _ = load_digits_split(0)
out = {}
runs = {"none": lambda: hvd.Compression.none,
        "pass": lambda: hvdcomp.Marsit(decision="pass"),
        "pass-skip": lambda: hvdcomp.Marsit(decision="pass", on_nonfinite="skip")}
for name, make in runs.items():
    compression = make()
    model, opt = build(compression, lr=0.1, momentum=0.9)
    comp, sent, identical = compressor_object(compression), [], 0
    for step in range(70):
        identical += train(model, opt, x, y, step, step + 1)
        if comp is not None:
            sent.append(comp.last_stats.bytes_sent)
    out[name] = {"sent": sent, "identical": identical, "digest": digest(model)}
report(rank=hvd.rank(), **out)
