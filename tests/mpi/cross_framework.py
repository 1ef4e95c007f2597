"""Rank script: the same inputs and settings through hvd.allreduce(compression=<method>(seed=3))
in PyTorch or TensorFlow (arg 1: torch|tf), three steps (so the per-tensor state is exercised);
rank 0 saves each method's results to ``<method>.npy`` in the directory named by arg 2. Args 3
on: methods of hvdcomp/registry.py in lower case (marsit, binsgdm, ...), one after the other in
this launch."""
import os
import sys

import numpy as np

from hvdcomp import registry
from report import report

framework, directory, methods = sys.argv[1], sys.argv[2], sys.argv[3:]
if framework == "torch":
    import torch
    import horovod.torch as hvd
    convert, back = torch.from_numpy, lambda t: t.numpy()
else:
    import tensorflow as tf
    import horovod.tensorflow as hvd
    convert, back = tf.constant, lambda t: t.numpy()
hvd.init()
for method in methods:
    comp = {m.lower(): cls for m, cls in registry.METHODS.items()}[method](seed=3)
    outs = []
    for step in range(3):
        x = np.random.default_rng(100 * step + hvd.rank()).standard_normal(3001).astype(np.float32)
        outs.append(back(hvd.allreduce(convert(x), name="cross.x", compression=comp)))
    if hvd.rank() == 0:
        np.save(os.path.join(directory, f"{method}.npy"), np.stack(outs))
    report(case=method, rank=hvd.rank(), step=comp.state_dict()["step"])
