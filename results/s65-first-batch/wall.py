import os, sys, time, collections
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
import tf_keras.src.optimizers.optimizer as O
from tensorflow.python.ops import cond_v2
spent = collections.Counter(); n = collections.Counter()
def timed(obj, name, label):
    orig = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter()
        try: return orig(*a, **k)
        finally: spent[label] += time.perf_counter() - t; n[label] += 1
    setattr(obj, name, w)
timed(O.Optimizer, "minimize", "minimize")
timed(O.Optimizer, "apply_gradients", "apply_gradients")
timed(cond_v2, "cond_v2", "cond_v2")
import hvdcomp.facade.compressor as C
import horovod.tensorflow as hvdt
import hvdcomp.frontends.tensorflow as F
timed(F.Deferred, "build", "Deferred.build"); timed(F.Deferred, "sent", "Deferred.sent")
timed(F.Deferred, "__init__", "Deferred.init")
from horovod.tensorflow import compression as hc
timed(hc.NoneCompressor, "compress", "none.compress")
import gc
gcs = []
def cb(phase, info):
    if phase == "start": cb.t = time.perf_counter()
    elif info["generation"] == 2: gcs.append(time.perf_counter() - cb.t)
    else: spent["gc01"] += time.perf_counter() - cb.t
gc.callbacks.append(cb)
import keras_steps
keras_steps.main()
spent["gc2"] = sum(gcs); n["gc2"] = len(gcs)
if hvdt.rank() == 0:
    print("WALL", {k: (round(v, 3), n[k]) for k, v in spent.items()})
