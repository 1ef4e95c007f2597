"""Per-tensor state of one compressor: a transactional store, and its checkpoint format.

State is keyed by tensor name: ``'<name>'`` holds the method's state (an error-feedback memory,
BinSGDM's ``(m, v)``), ``'<name>#rms'`` / ``'<name>#adam'`` the preconditioner's. Values are
arrays (NumPy, or torch tensors on the gradient's device) or tuples of arrays and ints.

Whole steps are transactions: a step ``put``s new values, which ``get`` does not see until
``commit()``; ``rollback()`` drops them, so a step that raises (NaN, rank mismatch) or is
skipped leaves the state exactly as before, at no cost (nothing is copied). For keys whose new
values are written into spares, a value replaced at ``commit()`` is not freed but kept as that
key's *spare*: ``spare(key, like)`` hands it out as the buffer to write the next step's value
into, so a steady-state step writes its new state into buffers kept across steps instead of
allocating (the committed value is never handed out as a spare, so a rollback still finds it
intact). ``scratch(key, like)`` is a work buffer that is not state at all (never saved), and
``outgoing(key, like, n)`` one that a result leaving hvdcomp may keep (reused once released).

Checkpoints (``hvdcomp.facade.BatchedCompressor.state_dict``), format 2::

    {"format": 2, "method": "Marsit", "settings": {...}, "rank": r, "size": n, "step": s,
     "seed": seed, "skipped": k, "state": {key: NumPy value}, "fusion": {...} (LayerFusion only)}

Format 1 (hvdcomp 0.1.0 before this layout) named ``"state"`` ``"memory"`` and had no
``"settings"``; ``read`` accepts both.
"""
import sys

import numpy as np

from hvdcomp.backend import xp

FORMAT = 2
READABLE_FORMATS = (1, 2)


_DROPPED = object()  # a staged removal (StateStore.drop)


class StateStore:
    """Transactional per-tensor state (see the module docstring)."""

    def __init__(self):
        self._committed = {}
        self._staged = {}
        self._spares = {}
        self._spare_keys = set()  # keys whose values are written into spares: theirs are kept
        self._scratch = {}

    def get(self, key, like=None):
        """The committed value for ``key`` (None if none), moved to ``like``'s kind and device
        when given (the moved value is kept, so the move happens once)."""
        value = self._committed.get(key)
        if value is None or like is None:
            return value
        moved = (tuple(_to_kind(v, like) for v in value) if isinstance(value, tuple)
                 else _to_kind(value, like))
        self._committed[key] = moved
        return moved

    def put(self, key, value):
        """Stage ``value`` as ``key``'s new state; visible to ``get`` after ``commit()``."""
        self._staged[key] = value

    def drop(self, key):
        """Stage the removal of ``key``'s value (``get`` returns None after ``commit()``)."""
        self._staged[key] = _DROPPED

    def spare(self, key, like, part=None):
        """A buffer shaped, typed and placed like ``like`` that holds no live state: the array
        ``key`` held before its last commit (``part``: array ``part`` of a tuple value, e.g.
        BinSGDM's ``(m, v)``) when it fits, else a new one. Contents: garbage. Each spare is
        handed out once. From the first call on, the values ``key`` replaces at ``commit()`` are
        kept as its spares (others are dropped: nobody would reuse them)."""
        self._spare_keys.add(key)
        if part is None:
            buf = self._spares.pop(key, None)
        else:
            old = self._spares.get(key)
            buf = old[part] if isinstance(old, tuple) and part < len(old) else None
            if buf is not None:
                self._spares[key] = old[:part] + (None,) + old[part + 1:]
        return buf if _fits(buf, like) else xp.empty_like(like)

    def scratch(self, key, like):
        """A work buffer like ``like``, kept for ``key`` across steps (not state, not saved)."""
        buf = self._scratch.get(key)
        if not _fits(buf, like):
            buf = self._scratch[key] = xp.empty_like(like)
        return buf

    def outgoing(self, key, like, n):
        """A buffer of ``n`` elements of ``like``'s dtype, kept for ``key`` across steps (not
        state, not saved), for a result that leaves hvdcomp and may outlive the step (what
        Horovod sums in place and hands back as the gradient, e.g. ``p.grad`` set to a view of
        it until the user's next ``zero_grad``). Contents: garbage. A NumPy buffer is handed out
        again only where nothing outside the store holds it any more: every NumPy view, torch
        tensor (``torch.from_numpy``) or TensorFlow tensor that shares its memory holds a
        reference to it, so its reference count tells; otherwise a new one takes its place. A
        tensor on a device is new at every call (its caching allocator makes that cheap). Why:
        a step that allocates a large host array pays the kernel's zeroing of every page of it
        (a 46 MB message per ResNet-18 step, 3-5 ms here)."""
        if xp.is_torch(like):
            return xp.empty_like(like, n)
        buf = self._scratch.get(key)
        # the table's reference, ``buf`` and getrefcount's argument: nobody else's
        if not (isinstance(buf, np.ndarray) and buf.dtype == like.dtype and buf.shape == (n,)
                and sys.getrefcount(buf) == 3):
            buf = self._scratch[key] = np.empty(n, dtype=like.dtype)
        return buf

    def scratch_bytes(self, key, nbytes):
        """A host uint8 work buffer of ``nbytes`` bytes, kept for ``key`` across steps (not
        state, not saved), e.g. a tensor's packed bits between two phases of a step."""
        buf = self._scratch.get(key)
        if not (isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.shape == (nbytes,)):
            buf = self._scratch[key] = np.empty(nbytes, dtype=np.uint8)
        return buf

    def commit(self):
        """Make the staged values the state; the values they replace become spares (of keys that
        ask for spares, when they share no array with their successor)."""
        for key, value in self._staged.items():
            if value is _DROPPED:
                self._committed.pop(key, None)
                continue
            old = self._committed.get(key)
            if old is not None and key in self._spare_keys and not _shared(old, value):
                self._spares[key] = old
            self._committed[key] = value
        self._staged = {}

    def rollback(self):
        """Drop the staged values: the state is as at the last commit."""
        self._staged = {}

    def discard(self, key):
        """Remove ``key``'s committed value now (not staged: e.g. a value that cannot be used)."""
        self._committed.pop(key, None)

    def forget(self, name):
        """Drop every value of tensor ``name`` (its method state and ``'<name>#...'``)."""
        for table in (self._committed, self._staged, self._spares, self._scratch):
            for key in [k for k in table if k == name or k.startswith(name + "#")]:
                del table[key]
        self._spare_keys = {k for k in self._spare_keys
                            if not (k == name or k.startswith(name + "#"))}

    @property
    def pending(self):
        """True while values are staged (a step is under way)."""
        return bool(self._staged)

    def keys(self):
        return sorted(self._committed)

    def to_host(self):
        """Every committed value as NumPy copies (tuples kept), sorted by key."""
        return {k: _host_copy(v) for k, v in sorted(self._committed.items())}

    def load(self, values):
        """Replace the whole state by ``values`` (as ``to_host`` returns), copied."""
        self._committed = {k: _host_copy(v) for k, v in values.items()}
        self._staged, self._spares = {}, {}


def checkpoint(ctx, fields, store, all_ranks):
    """A checkpoint of ``store`` (this rank's committed values) with the compressor's
    ``fields`` (method, settings, step, seed, skipped, fusion), for rank ``ctx.rank`` of
    ``ctx.size``; with ``all_ranks`` every rank's, gathered (a collective)."""
    local = {"format": FORMAT, **fields, "rank": ctx.rank, "size": ctx.size,
             "state": store.to_host()}
    if not all_ranks:
        return local
    return {"method": fields["method"], "format": FORMAT, "size": ctx.size,
            **{k: fields[k] for k in ("process_set",) if k in fields},
            "ranks": ctx.allgather_object(local)}


def this_ranks(checkpoint, method, ctx):
    """``(fields, values)`` of this rank from a checkpoint (one rank's or the all-ranks form,
    any readable format); ``HvdcompError`` when it was written by another method, world size
    or rank."""
    from hvdcomp.errors import HvdcompError
    if checkpoint.get("method") != method:
        raise HvdcompError(f"{method}: checkpoint holds {checkpoint.get('method')!r} state")
    if checkpoint.get("size") != ctx.size:
        raise HvdcompError(
            f"{method}: checkpoint was written by {checkpoint.get('size')} ranks, this "
            f"job has {ctx.size}; per-rank compressor memory cannot be re-split")
    if "ranks" in checkpoint:
        checkpoint = checkpoint["ranks"][ctx.rank]
    if checkpoint.get("rank") != ctx.rank:
        raise HvdcompError(f"{method}: rank {ctx.rank} was given rank "
                           f"{checkpoint.get('rank')}'s state")
    return checkpoint, read(checkpoint)


def read(checkpoint):
    """``checkpoint``'s per-tensor values, for any readable format (ValueError otherwise)."""
    fmt = checkpoint.get("format")
    if fmt not in READABLE_FORMATS:
        raise ValueError(f"checkpoint format {fmt!r} is not one of {READABLE_FORMATS}")
    return checkpoint["memory"] if fmt == 1 else checkpoint["state"]


def _host_copy(value):
    if isinstance(value, tuple):
        return tuple(np.array(xp.to_host(v), copy=True) for v in value)
    return np.array(xp.to_host(value), copy=True)


def _shared(old, new):
    """True when ``old`` and ``new`` (arrays or tuples) have an array in common, which then must
    not become a spare."""
    olds = old if isinstance(old, tuple) else (old,)
    news = new if isinstance(new, tuple) else (new,)
    return any(a is b for a in olds for b in news)


def _fits(buf, like):
    return (buf is not None and xp.is_torch(buf) == xp.is_torch(like) and buf.shape == like.shape
            and buf.dtype == like.dtype
            and getattr(buf, "device", None) == getattr(like, "device", None))


def _to_kind(value, like):
    if xp.is_torch(like) and not xp.is_torch(value):
        return xp.from_host(value, like)
    if xp.is_torch(like) and value.device != like.device:
        return value.to(like.device)
    return value
