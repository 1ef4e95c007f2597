"""The methods every benchmark compares: Horovod's own fp32 and fp16, and every hvdcomp method
(``hvdcomp/registry.py``), for either framework."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hvdcomp import registry  # noqa: E402

ALL_METHODS = ["hvd-fp32", "hvd-fp16", *registry.METHODS]


def make_compression(method, hvd):
    """The ``compression=`` argument of ``method`` for Horovod module ``hvd`` (horovod.torch or
    horovod.tensorflow): Horovod's Compression.none / fp16, or a fresh hvdcomp instance with its
    default settings."""
    if method == "hvd-fp32":
        return hvd.Compression.none
    if method == "hvd-fp16":
        return hvd.Compression.fp16
    return registry.METHODS[method]()
