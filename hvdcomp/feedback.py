"""Error feedback, shared by Marsit, TopK, SketchFusion and EF-signSGD.

Each rank keeps, per tensor, the part of its error-compensated gradient that the reduction did
not apply (its *memory* ``e``, state under the tensor's name), and adds it to the next step's
gradient before compressing: ``a = g + e``. What a method keeps as the new ``e`` (the residual)
is its own business; this module is where the memory is read, compensated into a reusable
buffer and written back, so that the methods do not touch the state store for it.
"""
from hvdcomp.backend import xp


def compensate(batch, entry):
    """Set ``entry.compensated`` to ``a = entry.work + e`` and return it.

    With no memory yet (first step) ``a`` *is* ``entry.work`` (possibly the user's gradient)
    and ``entry.owned`` is False: the method must not overwrite it. Otherwise ``a`` is written
    into the store's spare buffer for the tensor (no allocation in steady state) and
    ``entry.owned`` is True: the method may overwrite it, e.g. with the residual it keeps."""
    memory = batch.store.get(entry.key, like=entry.work)
    if memory is None:
        entry.compensated, entry.owned = entry.work, False
    else:
        entry.compensated = xp.add(entry.work, memory, out=batch.store.spare(entry.key,
                                                                             entry.work))
        entry.owned = True
    return entry.compensated


def keep(batch, entry, residual):
    """Store ``residual`` (same kind/device as the gradient) as the tensor's new memory; it
    becomes the state when the step lands (``hvdcomp.state``)."""
    batch.store.put(entry.key, residual)
