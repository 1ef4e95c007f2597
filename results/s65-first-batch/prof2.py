import cProfile, os, sys
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
import keras_steps
pr = cProfile.Profile(); pr.enable(); keras_steps.main(); pr.disable()
import horovod.tensorflow as hvd
if hvd.rank() == 0: pr.dump_stats(f"/tmp/p65/{os.environ['METHOD']}.prof")
