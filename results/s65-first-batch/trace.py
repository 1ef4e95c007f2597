import os, sys, time
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
from tensorflow.python.eager.polymorphic_function import tracing_compilation as tc
orig = tc._create_concrete_function
spans = []
depth = [0]
def w(*a, **k):
    t = time.perf_counter(); depth[0] += 1
    try: return orig(*a, **k)
    finally:
        depth[0] -= 1
        if depth[0] == 0: spans.append(time.perf_counter() - t)
tc._create_concrete_function = w
import keras_steps
keras_steps.main()
import horovod.tensorflow as hvd
if hvd.rank() == 0:
    print("TRACES", [round(s, 2) for s in spans], "sum", round(sum(spans), 2))
