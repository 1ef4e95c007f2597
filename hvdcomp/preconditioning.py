"""Preconditioners: what a rank sends instead of its raw gradient, composed with any method.

A preconditioner wraps the method's compressed mean, seen from the step engine
(``hvdcomp.engine``): ``makes_dense(entry, store)`` may send a tensor uncompressed this step
(a warm-up), ``before(entries, store)`` replaces each finite entry's working array by what is
sent, ``after(entries, reduced, store, phase)`` turns the mean over ranks (``reduced``: key ->
array) into what ``decompress`` returns, ``land()``/``drop()`` hear that the step's state was
committed or rolled back. Their state lives in the compressor's state store under
``'<name>#rms'`` / ``'<name>#adam'`` and is staged like the method's, so a skipped or failed
step leaves it as it was.

- ``None`` (``FollowAdam``, the default): the gradient as it is, except where the user's own
  optimizer is Adam or AdamW (the adapter finds it: ``Entry.adam``): there each rank sends its
  momentum and the user's Adam takes the synchronised one (see ``FollowAdam``).
- ``'rms'`` (``Rms``, math in ``hvdcomp.algorithms.precondition``): each rank divides its
  gradient by its own running root mean square per coordinate; the result is the mean
  normalised gradient.
- ``'adam'`` / ``hvdcomp.AdamSettings(...)`` (``Adam``, math in ``hvdcomp.algorithms.adam``): the
  compressor carries Adam, sends each rank's momentum after a dense warm-up and returns Adam's
  step direction (for a plain-SGD inner optimizer at Adam's learning rate).

``ThroughAdam`` wraps the preconditioner of every compressor whose result is the step itself
(``precondition='adam'``, BinSGDM): under the user's Adam/AdamW it sets Adam's moments so that
Adam's own update applies that step at the user's learning rate.
"""
from hvdcomp import checks, feedback
from hvdcomp.algorithms import adam
from hvdcomp.algorithms import precondition as rms
from hvdcomp.backend import xp

CHOICES = (None, "rms", "adam")
WORK = "-work"  # the store's scratch key suffix of a temporary


class Identity:
    """No preconditioning."""
    name = None
    adam = None
    returns_step = None  # the description of a preconditioner whose result is the step itself

    def makes_dense(self, entry, store):
        return False

    def carry(self, carry, store, entry):
        """Add the error-feedback memory of ``entry``, which the compress-or-pass decision now
        passes, to what it sends (``carry(store, entry)``: ``hvdcomp.feedback.carry`` or the
        method's own, e.g. node stages' shard memory)."""
        carry(store, entry)

    def before(self, entries, store):
        pass

    def after(self, entries, reduced, store, phase):
        pass

    def land(self):
        """The step's state was committed (``hvdcomp.engine``)."""

    def drop(self):
        """The step's state was rolled back."""


class FollowAdam(Identity):
    """The default preconditioner: the gradient as it is for every optimizer but the user's
    ``torch.optim.Adam``/``AdamW`` or Keras ``Adam``/``AdamW`` (``Entry.adam``: the torch
    adapter's ``AdamMoments``, TensorFlow's ``KerasAdamMoments``), whose own state it drives so
    that Adam users keep Adam.

    Why: Adam divides by a second moment of what it receives; fed a compressed gradient, that
    moment measures the compression (a 1-bit mean has one magnitude per tensor), not the
    gradient, and Adam degenerates to per-tensor normalised SGD (charlm: +20-29% loss). What
    error feedback keeps exact is a sum, so what crosses the network should be what Adam sums:
    its momentum (1-bit Adam, Tang et al. 2021; ``precondition='adam'`` carries the same
    algorithm for a plain-SGD inner optimizer).

    What is sent, per tensor, once the user's Adam has taken ``warmup`` steps on it (before that:
    the gradient itself, uncompressed, so Adam's moments start from dense mean gradients): each
    rank's momentum ``m_r = b1 m + (1-b1) g_r``, with ``m`` Adam's ``exp_avg`` (the same on every
    rank: every rank's Adam applies the same reduced gradients), through the method's compressed
    mean with its own error feedback. The mean ``M`` is returned as the gradient, and Adam's
    ``exp_avg`` is set to ``M`` when the step lands, so that Adam's own update makes its
    momentum ``b1 M + (1-b1) M = M`` (exactly) and its second moment ``b2 v + (1-b2) M**2``
    (AdaMomentum's, as in ``precondition='adam'``); Adam's bias corrections, learning-rate
    schedule and decoupled weight decay (AdamW) apply as usual. Where the user changes the
    gradient before Adam's step (clipping, scaling), the first moment is what Adam then reads
    (``follow_gradient`` of the adapters' moments, where they have it), so that Adam's
    update stays ``m / sqrt(v)`` of what it received. State kept by hvdcomp: the
    method's error memory only; Adam's moments stay in the user's optimizer (and its
    checkpoints).

    ``increment=True`` (a method whose ``under_adam`` is ``'increment'``: PowerSGD) sends only
    each rank's share of the new momentum, ``(1-b1) g_r``, and adds ``b1 m`` (the same on every
    rank) to its mean exactly: ``M = b1 m + C(mean((1-b1) g_r))``, the rest as above. A low-rank
    approximation of ``m_r`` spends its rank on ``b1 m``, nine tenths of the message that every
    rank already holds, and leaves the new part to error feedback (``hvdcomp.PowerSGD`` says
    what it measured); a 1-bit method keeps the momentum's signs better whole."""

    def __init__(self, warmup=adam.WARMUP, increment=False):
        self.warmup = warmup
        self.increment = increment
        self._landing = []  # (the user's Adam moments, the new momentum), written at land()
        self._carried = {}  # key -> its gradient's size, of entries that send [g, memory]
        self._adding = []  # (the user's Adam moments, what to add to its momentum) at land()

    def makes_dense(self, entry, store):
        return entry.adam is not None and entry.adam.steps() < self.warmup

    def carry(self, carry, store, entry):
        """The memory ``e`` of a tensor passed after compressed steps was kept of the momentum
        sent, so it goes to the user's Adam's momentum, not into its gradient: the entry sends
        ``[g, e]`` (one exact sum, twice the elements for this one step), its result is the mean
        of ``g``, and as the step lands the momentum ``m`` becomes ``m + mean(e) / b1``, which
        Adam's own update turns into ``b1 m + (1 - b1) mean(g) + mean(e)``: everything the
        compressed steps left unapplied, with the second moment fed the gradient alone (``e``
        put in the gradient as ``e / (1 - b1)`` would add ``(1 - b2)(e / (1 - b1))**2``, ~100
        times ``e**2`` at ``b1 = 0.9``, to ``v`` and slow every later step; charlm + AdamW).
        Adam with ``b1 = 0`` has no momentum to hold it: ``e`` joins its gradient."""
        if (entry.adam is None or entry.adam.beta1 == 0.0
                or not feedback.pending(store, entry.key)):
            return carry(store, entry)
        memory = _Shadow(entry.key, xp.zeros_like(entry.work), entry.numel)
        carry(store, memory)
        self._carried[entry.key] = entry.numel
        entry.work = xp.concat([entry.work, memory.work], entry.work)

    def before(self, entries, store):
        for e in entries:
            if e.adam is not None and not e.dense:
                b1 = e.adam.beta1
                msg = xp.multiply(e.work, 1.0 - b1, out=store.scratch(f"{e.key}#m", e.work))
                if not self.increment:
                    msg += xp.multiply(e.adam.exp_avg(e.work), b1,
                                       out=store.scratch(f"{e.key}#m{WORK}", e.work))
                e.work = msg

    def after(self, entries, reduced, store, phase):
        for e in entries:
            if e.adam is not None and not e.dense and e.status == checks.OK:
                if self.increment:  # M = b1 m + the mean increment (identical on every rank)
                    mean = reduced[e.key]
                    shared = xp.multiply(e.adam.exp_avg(mean), e.adam.beta1,
                                         out=store.scratch(f"{e.key}#m{WORK}", mean))
                    reduced[e.key] = xp.add(mean, shared, out=store.scratch(f"{e.key}#M", mean))
                self._landing.append((e.adam, kept_copy(store, f"{e.key}#m{WORK}",
                                                        reduced[e.key])))
            n = self._carried.pop(e.key, None)
            if n is not None and e.status == checks.OK:
                both = reduced[e.key]
                reduced[e.key] = both[:n]
                self._adding.append((e.adam, both[n:] * (1.0 / e.adam.beta1)))

    def land(self):
        for moments, momentum in self._landing:
            moments.set_exp_avg(momentum)
            follow = getattr(moments, "follow_gradient", None)
            if follow is not None:
                follow()
        for moments, memory in self._adding:
            moments.set_exp_avg(xp.add(memory, moments.exp_avg(memory), out=memory))
        self.drop()

    def drop(self):
        self._landing, self._adding, self._carried = [], [], {}


class _Shadow:
    """What ``hvdcomp.feedback.carry`` (or a method's carry) reads and writes of an entry: the
    memory of ``key`` is added to ``work`` (zeros of the entry's size)."""
    __slots__ = ("key", "work", "numel")

    def __init__(self, key, work, numel):
        self.key, self.work, self.numel = key, work, numel


def kept_copy(store, key, array):
    """A copy of ``array`` in the store's scratch buffer ``key`` (no allocation in steady
    state): what lands in the user's Adam at the end of the step, after the result itself has
    been scaled (``hvdcomp.loss_scale``) or handed over."""
    return xp.add(array, 0.0, out=store.scratch(key, array))


def sends_momentum(preconditioner, entry):
    """Whether ``entry``'s working array this step is the user's Adam momentum (``FollowAdam``
    past its dense warm-up) rather than a gradient. Sparse methods send more of it (their
    ``momentum_ratio``): Adam moves every coordinate by about its learning rate each step, so a
    coordinate left out of the sparse mean loses its step, not only its delay
    (benchmarks/convergence.py --tasks recipes)."""
    return isinstance(preconditioner, FollowAdam) and entry.adam is not None and not entry.dense


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


class ThroughAdam:
    """``inner`` (the preconditioner of a compressor whose result ``u`` is the step itself:
    ``precondition='adam'``, or ``Identity`` for BinSGDM) made to work under the user's own
    ``torch.optim.Adam``/``AdamW`` or Keras ``Adam``/``AdamW`` too, instead of plain SGD only.

    Why: such a compressor already is an Adam-like optimizer (``u`` has Adam's per-coordinate
    normalisation: BinSGDM's mean vote in [-1, 1], or Adam's step direction); the user's Adam,
    fed ``u`` as a gradient, would normalise it again (training stalls or diverges). So as the
    step lands, for each tensor whose optimizer is Adam (``Entry.adam``), the moments Adam is
    about to update are set so that its update is exactly ``lr * u``: with ``t`` Adam's step
    count after this step, ``bc1 = 1 - b1**t``, ``bc2 = 1 - b2**t``, first moment ``u`` and
    second moment ``(bc2 / bc1**2 - (1 - b2) u**2) / b2``, Adam's own rules give ``m = u`` and
    ``sqrt(v / bc2) = 1 / bc1``, so its update is ``lr u / (1 + eps bc1)`` (torch; Keras's eps,
    added to ``sqrt(v)``, is as small). The user's learning rate, schedule and (decoupled)
    weight decay apply as usual; Adam's betas are unused (the compressor's own momentum and
    normaliser stand for them). Nothing is sent for it and hvdcomp keeps no state for it (Adam's
    moments stay in the user's optimizer and its checkpoints). Where Adam has no state yet
    (torch's Adam creates it at its first step) nothing is set, and that first update is
    Adam's own on ``u``: ``lr * sign(u)``, still at most ``lr`` per coordinate. Other optimizers
    are refused at the first step (``hvdcomp.checks.inner_optimizer``) unless plain SGD, and so
    is an Adam whose moments cannot be set so (``amsgrad``, ``maximize``, ``beta2 = 0``: the
    adapters' ``drivable_adam``)."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.adam, self.returns_step = inner.name, inner.adam, inner.returns_step
        self._landing = []  # (the user's Adam moments, the step u), written at land()

    def makes_dense(self, entry, store):
        return self.inner.makes_dense(entry, store)

    def carry(self, carry, store, entry):
        self.inner.carry(carry, store, entry)

    def before(self, entries, store):
        self.inner.before(entries, store)

    def after(self, entries, reduced, store, phase):
        self.inner.after(entries, reduced, store, phase)
        for e in entries:  # a message Horovod sums lands as it is handed back (Runtime.stepped)
            if e.adam is not None and e.status == checks.OK and not e.by_horovod:
                self._landing.append((e.adam, kept_copy(store, f"{e.key}#u", reduced[e.key])))

    def land(self):
        self.inner.land()
        for moments, u in self._landing:
            drive_adam(moments, u)
        self._landing = []

    def drop(self):
        self.inner.drop()
        self._landing = []


def drive_adam(moments, u):
    """Set the user's Adam ``moments`` (the adapters' ``AdamMoments``) so that its coming update
    is ``lr * u`` (``ThroughAdam``; flat ``u``, copied); nothing where Adam has no state yet."""
    if not moments.started():
        return
    t, b1, b2 = moments.steps() + 1, moments.beta1, moments.beta2
    target = (1.0 - b2 ** t) / (1.0 - b1 ** t) ** 2
    moments.set_exp_avg(u)
    moments.set_exp_avg_sq((target - (1.0 - b2) * u * u) / b2)


def make(spec, under_adam="momentum"):
    """The preconditioner for a compressor's ``precondition=`` argument (ValueError if bad).
    ``'adam'`` returns the step itself, so it is wrapped in ``ThroughAdam``. None gives what the
    method does under the user's Adam (``under_adam``): ``'momentum'``, ``FollowAdam`` (its
    mean of the momentum stands in for Adam's own); ``'increment'``, ``FollowAdam`` sending the
    momentum's increment; ``'gradient'``, ``Identity`` (Adam is fed the reduced gradient);
    ``'step'``, ``ThroughAdam(Identity())`` (its result is the step itself: BinSGDM)."""
    if isinstance(spec, adam.AdamSettings):
        return ThroughAdam(Adam(spec))
    if spec not in CHOICES:
        raise ValueError(f"precondition must be one of {CHOICES} or an hvdcomp.AdamSettings, "
                         f"got {spec!r}")
    if spec is not None:
        return Rms() if spec == "rms" else ThroughAdam(Adam(adam.AdamSettings()))
    return {"momentum": FollowAdam, "increment": lambda: FollowAdam(increment=True),
            "gradient": Identity,
            "step": lambda: ThroughAdam(Identity())}[under_adam]()
