"""Thin adapters between a training framework's tensors and the shared backend.

An adapter answers, for one tensor: its name as the framework's Horovod integration knows it,
a flat working array for the backend, the 1-element placeholder that travels through Horovod's
own allreduce, and how to turn a backend result back into a tensor like the input.
"""
from hvdcomp.facade.frontends.identity import Identity

__all__ = ["Identity", "adapter_for"]


def adapter_for(tensor):
    """The adapter module for ``tensor``'s framework (torch, TensorFlow or NumPy)."""
    adapter = _ADAPTERS.get(type(tensor))
    if adapter is None:
        mod = type(tensor).__module__
        if mod.startswith("torch"):
            from hvdcomp.facade.frontends import torch as adapter
        elif mod.startswith("tensorflow"):
            from hvdcomp.facade.frontends import tensorflow as adapter
        else:
            from hvdcomp.facade.frontends import numpy as adapter
        _ADAPTERS[type(tensor)] = adapter
    return adapter


_ADAPTERS = {}  # tensor type -> adapter module
