"""The sign message that Marsit, EF-signSGD and BinSGDM share: 1 bit per element.

- ``hvdcomp.signs.merge``: the math on host or device arrays (compensation, the l1 scale, the
  packed bits, Marsit's unbiased merge of two partial aggregates, the step and the memory);
- ``hvdcomp.signs.message``: the phases of a batch (``prepare``: compensation and scales;
  ``message``: the batch's packed bits);
- ``hvdcomp.signs.kernels``: the fused numba kernels of the same math, bit for bit (loaded by
  the step engine where compressing pays: ``KERNELS`` names them to ``hvdcomp.kernels``).
"""
KERNELS = "hvdcomp.signs.kernels"
