import os, sys, time, collections
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
from tensorflow.python.framework import ops as tfops
counts = collections.Counter()
orig = tfops.Graph._create_op_internal
def w(self, op_type, *a, **k):
    counts[op_type] += 1
    return orig(self, op_type, *a, **k)
tfops.Graph._create_op_internal = w
import keras_steps
keras_steps.main()
import horovod.tensorflow as hvd
if hvd.rank() == 0:
    print("OPS", sum(counts.values()), counts.most_common(25))
