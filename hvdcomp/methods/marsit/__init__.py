"""Marsit: unbiased 1-bit merges at every hop of a ring all-reduce. ``method.py``: its settings
and phases; its math and kernels are the shared sign message (``hvdcomp.signs``)."""
from hvdcomp.methods.marsit.method import Marsit

__all__ = ["Marsit"]
