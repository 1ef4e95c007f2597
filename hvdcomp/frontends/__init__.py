"""Thin adapters between a training framework's tensors and the shared backend.

An adapter answers, for one tensor: its name as the framework's Horovod integration knows it,
a flat working array for the backend, the 1-element placeholder that travels through Horovod's
own allreduce, and how to turn a backend result back into a tensor like the input.
"""
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


def adapter_for(tensor):
    """The adapter module for ``tensor``'s framework (torch, TensorFlow or NumPy)."""
    adapter = _ADAPTERS.get(type(tensor))
    if adapter is None:
        mod = type(tensor).__module__
        if mod.startswith("torch"):
            from hvdcomp.frontends import torch as adapter
        elif mod.startswith("tensorflow"):
            from hvdcomp.frontends import tensorflow as adapter
        else:
            from hvdcomp.frontends import numpy as adapter
        _ADAPTERS[type(tensor)] = adapter
    return adapter


_ADAPTERS = {}  # tensor type -> adapter module
