"""What a framework's Horovod integration tells hvdcomp about a tensor (``Identity``)."""
from typing import Any, NamedTuple, Optional


class Identity(NamedTuple):
    """What the framework's Horovod integration knows about a tensor handed to ``compress``:
    ``name`` (its Horovod name, the same on every rank; None if none), ``owner`` (the parameter
    or variable, or None), ``process_set`` (the Horovod ``ProcessSet`` of the call, None for the
    global one), ``optimizer`` (the Horovod distributed optimizer it comes from, or None),
    ``call``: the framework call that hands this tensor over together with others, when the
    adapter can see it (TensorFlow's ``allreduce_grads``: its ``grads`` and ``vars`` lists, so
    that the step's gradients are reduced as one batch), else None; ``horovod_op``: the
    reduction op the call's own collective applies (TensorFlow's ``allreduce``: its ``op``,
    e.g. ``hvd.Average``), where the adapter reads it, else None."""
    name: Optional[str]
    owner: Any = None
    process_set: Any = None
    optimizer: Any = None
    call: Any = None
    horovod_op: Any = None
