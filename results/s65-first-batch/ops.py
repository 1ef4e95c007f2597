import os, sys, time, collections
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
import hvdcomp.frontends.tensorflow as F
log = collections.defaultdict(list)
def timed(cls, name):
    orig = getattr(cls, name)
    def w(self, *a, **k):
        t = time.perf_counter()
        try: return orig(self, *a, **k)
        finally: log[name].append((t, time.perf_counter() - t))
    setattr(cls, name, w)
timed(F.StepBatch, "_planned"); timed(F.StepBatch, "_reduce")
import keras_steps
t0 = time.perf_counter()
keras_steps.main()
import horovod.tensorflow as hvd
if hvd.rank() == 0:
    for k, v in log.items():
        print(k, len(v), "first 12 (start s, ms):", [(round(t - t0, 2), round(d * 1e3, 1)) for t, d in v[:12]])
        print(k, "sum ms", round(sum(d for _, d in v) * 1e3, 1))
