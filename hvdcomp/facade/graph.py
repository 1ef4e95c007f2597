"""What the graph front ends call on a compressor, beside Horovod's ``Compressor`` protocol.

TensorFlow's ``tf.function`` and Keras steps (``hvdcomp.facade.frontends.tensorflow``) and a direct
allreduce of a host array cannot wait for a later ``decompress`` to flush the step: they hand the
step's arrays over as one batch and take the results at once (``reduce_batch_now``,
``reduce_now``), after asking which tensors Horovod's own allreduce sums this step
(``horovod_plan``) and saying when a result was handed over (``handed_over``), which ends the
decision's exchange window. ``BatchedCompressor`` inherits these calls.
"""
import numpy as np

from hvdcomp.facade import ownership
from hvdcomp.engine import Entry, pass_planned
from hvdcomp.facade.frontends import adapter_for
from hvdcomp.facade.frontends import numpy as np_adapter


class GraphCalls:
    """The graph front ends' calls (module docstring), on a ``BatchedCompressor`` (``_lock``,
    ``runtimes``, ``op_factor``)."""

    def reduce_now(self, key, array, reduced_placeholder, process_set=None):
        """``decompress``'s result for one host array (a direct allreduce) reduced now, times
        its reduced placeholder's op factor (checked before anything is communicated)."""
        ranks = ownership.process_set_ranks(process_set)
        factor = self.op_factor(np_adapter.reduced(reduced_placeholder), key, ranks)
        (flat,) = self.reduce_batch_now([key], [array], gradients=False, process_set=process_set)
        return np.asarray(flat * factor if factor != 1 else flat, array.dtype).reshape(array.shape)

    def reduce_batch_now(self, keys, arrays, gradients=True, adam=None, process_set=None,
                         by_horovod=None):
        """The graph front ends' entry point: each array's mean over ``process_set`` (flat,
        float32 or float64, where it was), reduced now as one batch, the same keys on every rank
        of the set (gradients, adam: Entry's). ``by_horovod``: per key, whether Horovod's own
        allreduce sums that array this step (``horovod_plan``): hvdcomp only checks it, and its
        result is a ``hvdcomp.engine.HorovodSum``."""
        summed = by_horovod if by_horovod is not None else [False] * len(keys)
        with self._lock:
            rt = self.runtimes.for_set(process_set)
            entries = [rt.engine.entry(k, a, adapter_for(a), by_horovod=True, adam=m) if b
                       else Entry(k, a, adapter_for(a), gradient=gradients, adam=m)
                       for k, a, m, b in zip(keys, arrays, adam or [None] * len(keys), summed)]
            rt.driver.whole_step(entries)
            return [rt.engine.take(e.ticket)[0] for e in entries]

    def horovod_plan(self, numels, keys, process_set=None, whole=False, countdown=None):
        """A graph front end's step plan, before its gradients reach Horovod (the step's
        exchange window starts here, ``hvdcomp.decision``): per key (a gradient of ``numels[i]``
        elements), whether Horovod sums it (``Runtime.hands_to_horovod``), ``quiet, silent``
        (``hvdcomp.engine.pass_planned``: the ``whole`` batch passed) and how many following
        steps its ``countdown`` may end itself (``hvdcomp.engine.QuietGrant``)."""
        with self._lock:
            rt = self.runtimes.for_set(process_set)
            rt.decision.begin()
            plan = [rt.hands_to_horovod(n, k, lambda: False) for n, k in zip(numels, keys)]
            quiet, silent = pass_planned(rt.engine, numels) if whole and all(plan) else (False,) * 2
            rt.ahead.countdown = countdown
            granted = rt.ahead.grant(rt.engine, numels, silent and countdown is not None)
            return plan, quiet, silent, granted

    def handed_over(self, process_set=None):
        """A graph front end handed a result of the step over (after Horovod's own allreduce of
        the tensors it sums): the decision's exchange window ends here unless another follows."""
        self.runtimes.for_set(process_set).decision.mark()
