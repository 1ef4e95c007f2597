"""Error feedback, shared by Marsit, TopK, SketchFusion and EF-signSGD.

Each rank keeps, per tensor, the part of its error-compensated gradient that the reduction did
not apply (its *memory* ``e``, state under the tensor's name), and adds it to the next step's
gradient before compressing: ``a = g + e``. What a method keeps as the new ``e`` (the residual)
is its own business; this module is where the memory is read, compensated into a reusable
buffer and written back, so that the methods do not touch the state store for it.
"""
from hvdcomp.backend import xp


def buffers(batch, entry):
    """``(memory, out)`` for compensating ``entry``, without computing anything: ``memory`` is
    the tensor's memory ``e`` (None on the first step) and ``out`` the buffer that must receive
    ``a = entry.work + e`` (the store's spare buffer; None on the first step, when ``a`` *is*
    ``entry.work``). Sets ``entry.compensated`` (``out``, or ``entry.work``) and
    ``entry.owned`` (True when the method may overwrite it). The caller writes ``out`` before
    anything reads ``entry.compensated``: ``compensate`` does, a fused kernel may do it along
    with its own work (``hvdcomp.kernels``)."""
    memory = batch.store.get(entry.key, like=entry.work)
    if memory is None:
        entry.compensated, entry.owned = entry.work, False
        return None, None
    entry.compensated = batch.store.spare(entry.key, entry.work)
    entry.owned = True
    return memory, entry.compensated


def compensate(batch, entry):
    """Set ``entry.compensated`` to ``a = entry.work + e`` and return it.

    With no memory yet (first step) ``a`` *is* ``entry.work`` (possibly the user's gradient)
    and ``entry.owned`` is False: the method must not overwrite it. Otherwise ``a`` is written
    into the store's spare buffer for the tensor (no allocation in steady state) and
    ``entry.owned`` is True: the method may overwrite it, e.g. with the residual it keeps."""
    memory, out = buffers(batch, entry)
    if memory is not None:
        xp.add(entry.work, memory, out=out)
    return entry.compensated


def carry(store, entry):
    """Add the tensor's memory ``e`` to what ``entry`` sends uncompressed this step (``work +
    e``, a new array) and stage its removal, when it has one: a tensor the compress-or-pass
    decision passes (``hvdcomp.decision``) loses nothing of what its compressed steps left
    unapplied (a preconditioner may route it elsewhere: ``hvdcomp.preconditioning``). A skipped
    step rolls the removal back with the rest."""
    memory = store.get(entry.key, like=entry.work)
    if memory is None:
        return
    entry.work = entry.work + memory
    store.drop(entry.key)


OWNER = "#owner"  # node stages with whole-tensor shares: the local rank holding the memory


def pending(store, key):
    """Whether tensor ``key`` may hold a memory to carry on some rank of its group, the same
    answer on every rank: its memory here, or (node stages with whole-tensor shares,
    ``hvdcomp.hierarchical``) an owner recorded on every rank of the node, only one of which
    holds the memory."""
    return store.get(key) is not None or store.get(key + OWNER) is not None


def keep(batch, entry, residual):
    """Store ``residual`` (same kind/device as the gradient) as the tensor's new memory; it
    becomes the state when the step lands (``hvdcomp.state``)."""
    batch.store.put(entry.key, residual)
