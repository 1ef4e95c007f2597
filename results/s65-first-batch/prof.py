import cProfile, pstats, os, sys, io
sys.argv = ["keras_steps.py", os.environ["METHOD"]]
sys.path.insert(0, "/work/main/benchmarks")
import keras_steps
pr = cProfile.Profile()
pr.enable()
keras_steps.main()
pr.disable()
import horovod.tensorflow as hvd
if hvd.rank() == 0:
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s).sort_stats("cumulative")
    st.print_stats("hvdcomp|horovod/tensorflow/__init__|horovod/_keras", 60)
    open(f"/tmp/p65/prof-{os.environ['METHOD']}.txt", "w").write(s.getvalue())
