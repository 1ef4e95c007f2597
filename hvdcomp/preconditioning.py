"""Preconditioners: what a rank sends instead of its raw gradient, composed with any method.

A preconditioner wraps the method's compressed mean, seen from the step engine
(``hvdcomp.engine``): ``makes_dense(entry, store)`` may send a tensor uncompressed this step
(a warm-up), ``before(entries, store)`` replaces each finite entry's working array by what is
sent, ``after(entries, reduced, store, phase)`` turns the mean over ranks (``reduced``: key ->
array) into what ``decompress`` returns. Their state lives in the compressor's state store under
``'<name>#rms'`` / ``'<name>#adam'`` and is staged like the method's, so a skipped or failed
step leaves it as it was.

- ``None`` (``Identity``): the gradient as it is.
- ``'rms'`` (``Rms``, math in ``hvdcomp.algorithms.precondition``): each rank divides its
  gradient by its own running root mean square per coordinate; the result is the mean
  normalised gradient.
- ``'adam'`` / ``hvdcomp.AdamSettings(...)`` (``Adam``, math in ``hvdcomp.algorithms.adam``): the
  compressor carries Adam, sends each rank's momentum after a dense warm-up and returns Adam's
  step direction (for a plain-SGD inner optimizer at Adam's learning rate).
"""
from hvdcomp import checks
from hvdcomp.algorithms import adam
from hvdcomp.algorithms import precondition as rms

CHOICES = (None, "rms", "adam")
WORK = "-work"  # the store's scratch key suffix of a temporary


class Identity:
    """No preconditioning."""
    name = None
    adam = None
    returns_step = None  # the description of a preconditioner whose result is the step itself

    def makes_dense(self, entry, store):
        return False

    def before(self, entries, store):
        pass

    def after(self, entries, reduced, store, phase):
        pass


class Rms(Identity):
    """'rms': ``u = g / (sqrt(v_hat) + eps)``; state ``(t, v)`` per tensor, this rank's own."""
    name = "rms"

    def before(self, entries, store):
        for e in entries:
            key = f"{e.key}#rms"
            # v into the spare of the state, u (what is sent) into a kept work buffer
            buffers = (store.spare(key, e.work, part=1), store.scratch(key, e.work))
            e.work, new_state = rms.step(store.get(key, like=e.work), e.work, out=buffers)
            store.put(key, new_state)


class Adam(Identity):
    """'adam': state ``(t, m, v)`` per tensor, the same on every rank."""
    name = "adam"
    returns_step = "precondition='adam'"

    def __init__(self, settings):
        self.adam = settings

    def makes_dense(self, entry, store):
        # warm-up or not: the same on every rank (t is shared)
        return adam.is_dense(store.get(f"{entry.key}#adam"), self.adam)

    def before(self, entries, store):
        for e in entries:
            key = f"{e.key}#adam"
            state = store.get(key, like=e.work)
            if adam.is_dense(state, self.adam):
                continue  # a warm-up step sends the gradient itself (no buffers taken)
            # the momentum sent, and a temporary: kept work buffers (not state)
            buffers = (store.scratch(key, e.work), store.scratch(key + WORK, e.work))
            e.work = adam.message(state, e.work, self.adam, out=buffers)

    def after(self, entries, reduced, store, phase):
        with phase("decode"):
            for e in entries:
                if e.status != checks.OK:
                    continue
                key = f"{e.key}#adam"
                state = store.get(key, like=reduced[e.key])
                # the new (m, v) into the spares of the state; u into the reduced mean itself
                like = reduced[e.key]
                buffers = (store.spare(key, like, part=1), store.spare(key, like, part=2),
                           store.scratch(key + WORK, like))
                reduced[e.key], new_state = adam.update(state, like, e.dense, self.adam,
                                                        out=buffers)
                store.put(key, new_state)


def make(spec):
    """The preconditioner for a compressor's ``precondition=`` argument (ValueError if bad)."""
    if isinstance(spec, adam.AdamSettings):
        return Adam(spec)
    if spec not in CHOICES:
        raise ValueError(f"precondition must be one of {CHOICES} or an hvdcomp.AdamSettings, "
                         f"got {spec!r}")
    return {None: Identity, "rms": Rms}.get(spec, lambda: Adam(adam.AdamSettings()))()
