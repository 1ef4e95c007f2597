"""BinSGDM: one-bit momentum over a hierarchical 1-bit all-reduce. ``method.py``: settings and
phases; ``math.py``: moments, direction and votes; ``stochastic.py``: its counter-hash uniforms;
``kernels.py``: the fused kernels of the same math."""
from hvdcomp.methods.binsgdm.method import BinSGDM

__all__ = ["BinSGDM"]
