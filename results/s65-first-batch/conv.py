import os, sys, collections, time
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
from tensorflow.python.autograph.impl import api
orig = api._convert_actual
seen = collections.Counter(); spent = collections.Counter()
def logged(entity, program_ctx):
    t = time.perf_counter()
    try:
        return orig(entity, program_ctx)
    finally:
        k = f"{getattr(entity, '__module__', '?')}.{getattr(entity, '__qualname__', entity)}"
        seen[k] += 1; spent[k] += time.perf_counter() - t
api._convert_actual = logged
import keras_steps
keras_steps.main()
import horovod.tensorflow as hvd
if hvd.rank() == 0:
    for k, n in spent.most_common(60):
        print(f"CONV {n:.3f}s x{seen[k]} {k}")
