"""Sign bits packed 8 per byte, and the bit-wise merge used by Marsit.

Bit layout (the same for NumPy and Torch): element ``i`` of a vector is bit ``7 - (i % 8)`` of
byte ``i // 8`` (most significant bit first, as ``numpy.packbits``). A bit is 1 when the element's
IEEE sign bit is clear (positive numbers and +0.0) and 0 when it is set (negative numbers and
-0.0), the sign ``copysign`` reads, so ``copysign(s, x)`` rebuilds a rank's own message exactly
(callers reject NaN before packing). Unused bits of the last byte are 0. Any length works, not
only multiples of 8.
"""
import numpy as np

from hvdcomp.backend.xp import is_torch, _torch

_SHIFTS = np.arange(7, -1, -1, dtype=np.uint8)


def packed_nbytes(n):
    """Bytes needed for ``n`` packed bits."""
    return (int(n) + 7) // 8


def _on_cpu(x):
    return is_torch(x) and x.device.type == "cpu"


def pack_signs(x):
    """Pack the signs of a 1-D float array ``x`` (length n) into ``ceil(n/8)`` uint8 bytes."""
    if _on_cpu(x):  # NumPy's C kernel, zero-copy both ways
        return _torch().from_numpy(np.packbits(~np.signbit(x.detach().reshape(-1).numpy())))
    if is_torch(x):
        torch = _torch()
        n = x.numel()
        bits = (~torch.signbit(x.reshape(-1))).to(torch.uint8)
        pad = packed_nbytes(n) * 8 - n
        if pad:
            bits = torch.cat([bits, bits.new_zeros(pad)])
        shifts = torch.as_tensor(_SHIFTS, device=x.device)
        return (bits.reshape(-1, 8) << shifts).sum(dim=1, dtype=torch.uint8)
    return np.packbits(~np.signbit(np.asarray(x).reshape(-1)))


def unpack_signs(packed, n, dtype="float32"):
    """The ±1 vector (length ``n``, float ``dtype``) encoded by ``packed`` (uint8)."""
    if _on_cpu(packed):
        return _torch().from_numpy(unpack_signs(packed.numpy(), n, dtype))
    if is_torch(packed):
        torch = _torch()
        shifts = torch.as_tensor(_SHIFTS, device=packed.device)
        bits = ((packed.reshape(-1, 1) >> shifts) & 1).reshape(-1)[:n]
        return bits.to(getattr(torch, dtype)) * 2 - 1
    bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), count=n).view(np.int8)
    bits *= 2
    bits -= 1  # 0/1 -> -1/+1 in place, in int8
    return bits.astype(dtype)


def merge_bits(acc, own, mask):
    """Bit-wise select: where ``mask`` is 1 take ``own``, elsewhere keep ``acc``.

    All three are uint8 arrays of the same length (packed bits); returns
    ``acc ^ ((acc ^ own) & mask)``, a new array of the same kind.
    """
    return acc ^ ((acc ^ own) & mask)
