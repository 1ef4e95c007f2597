import os, sys, time, cProfile, pstats, io
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
import hvdcomp.frontends.tensorflow as F
best = [0, None]
orig = F.StepBatch._reduce
def w(self, *a):
    pr = cProfile.Profile(); t = time.perf_counter(); pr.enable()
    try: return orig(self, *a)
    finally:
        pr.disable(); d = time.perf_counter() - t
        if d > best[0]: best[:] = [d, pr]
F.StepBatch._reduce = w
import keras_steps
keras_steps.main()
import horovod.tensorflow as hvd
if hvd.rank() == 0:
    s = io.StringIO(); pstats.Stats(best[1], stream=s).sort_stats("cumulative").print_stats(45)
    print("SLOWEST", best[0]); print(s.getvalue())
