"""Shared compression kernels for NumPy arrays and Torch tensors (CPU or CUDA).

Every function here takes either a ``numpy.ndarray`` or a ``torch.Tensor`` and returns the same
kind, on the same device. Nothing here knows about Horovod, MPI or a training framework.
"""
from hvdcomp.backend.bits import pack_signs, unpack_signs, merge_bits
from hvdcomp.backend.masks import bernoulli_mask, mask_words_digits

__all__ = ["pack_signs", "unpack_signs", "merge_bits", "bernoulli_mask", "mask_words_digits"]
