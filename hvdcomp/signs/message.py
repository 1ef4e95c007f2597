"""The sign-message phases shared by Marsit and EF-signSGD: compensation with the l1 scale
(``prepare``) and the batch's packed sign bits (``message``).

Host float tensors go through the fused kernel ``hvdcomp.signs.kernels.encode`` (one pass:
``p = g + e``, ``sum |p|`` and the packed bits, kept in the store's scratch until
``message``); other tensors, or ``HVDCOMP_KERNELS=numpy``, through the reference
(``hvdcomp.feedback.compensate``, ``hvdcomp.signs.merge.l1_scale``,
``hvdcomp.backend.pack_signs``). Both give the same scale and bits, bit for bit.
"""
import numpy as np

from hvdcomp import feedback, kernels
from hvdcomp.signs import merge as alg
from hvdcomp.backend import pack_signs, xp
from hvdcomp.backend.bits import packed_nbytes
from hvdcomp.signs import KERNELS

BITS = "#bits"  # scratch key suffix of a tensor's packed bits between prepare and message


def fused(entry):
    """True when ``entry`` runs the fused kernels (``hvdcomp.kernels.active``)."""
    return kernels.active(KERNELS, entry.work)


def compensate(batch, entry):
    """Compensate ``entry`` (``hvdcomp.feedback``: ``entry.compensated``, ``entry.owned``) and
    return its l1 scale ``||p||_1 / d``; the fused path also packs its signs for ``message``."""
    if not fused(entry):
        return alg.l1_scale(feedback.compensate(batch, entry))
    from hvdcomp.signs import kernels as signs
    memory, out = feedback.buffers(batch, entry)
    bits = batch.store.scratch_bytes(entry.key + BITS, packed_nbytes(entry.numel))
    return alg.l1_scale(entry.compensated, total=signs.encode(entry.work, memory, out, bits))


def message(batch):
    """The batch's packed sign bits, tensors end to end (each from a byte boundary), as a
    fresh uint8 host array (the collectives may overwrite it)."""
    return np.concatenate([
        batch.store.scratch_bytes(e.key + BITS, packed_nbytes(e.numel)) if fused(e)
        else np.ascontiguousarray(xp.to_host(pack_signs(e.compensated)))
        for e in batch.entries])


def decode_buffers(batch, entry):
    """``(p, step, memory)`` for a fused decode of ``entry``: its compensated vector, the array
    for the step (it becomes the user's gradient: ``Entry.result_buffer``, the gradient itself
    where allowed) and where the new memory goes (``p`` itself when the method owns it, else the
    store's spare buffer)."""
    p = entry.compensated
    return p, entry.result_buffer(p), p if entry.owned else batch.store.spare(entry.key, p)
