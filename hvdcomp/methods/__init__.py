"""The compression methods, one folder each, and the contract they implement.

- ``hvdcomp.methods.contract``: ``Method``, what a method is given and returns;
- ``marsit``, ``binsgdm``, ``topk``, ``sketchfusion``, ``efsignsgd``, ``powersgd``: one package per
  method: ``method.py`` (its ``Method`` subclass: settings and the phases of a batch), and where
  it has them ``math.py`` (pure math on host or device arrays), ``kernels.py`` (its fused numba
  kernels) and its own collectives.

What several methods share has one place each: the sign message (``hvdcomp.signs``), bits and
array helpers (``hvdcomp.backend``), top-k selection (``hvdcomp.backend.topk``,
``hvdcomp.kernels.topk``), error feedback (``hvdcomp.feedback``), preconditioning
(``hvdcomp.preconditioning``), the collectives (``hvdcomp.comm``: ring, tree, node stages).
A method imports none of the engine, the facade, the front ends or Horovod (tests/test_layout.py).
"""
