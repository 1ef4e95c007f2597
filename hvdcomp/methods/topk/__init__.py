"""TopK: bidirectional top-k sparsification with error feedback. ``method.py``: settings, phases
and the sparse exchange; ``math.py``: target counts and sparse sums (selection in
``hvdcomp.backend.topk``, its fused scan in ``hvdcomp.kernels.topk``, the tree in
``hvdcomp.comm.tree``)."""
from hvdcomp.methods.topk.method import TopK

__all__ = ["TopK"]
