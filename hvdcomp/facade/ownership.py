"""Whose tensors a compressor serves: the parameters its per-tensor state belongs to, the
Horovod process set it reduces over, and the optimizers whose parameter lists the ranks agreed
on. ``hvdcomp.facade.BatchedCompressor.compress`` consults the ``Ownership`` of the tensor's
process set (one per ``hvdcomp.facade.runtime.Runtime``) with each tensor's
``hvdcomp.facade.frontends.Identity`` and acts on the answer."""
import gc
import weakref

from hvdcomp import checks
from hvdcomp.comm import world_rank, world_size
from hvdcomp.errors import HvdcompError

FRESH, FORGET = "fresh", "forget"


class Ownership:
    """The owners of one runtime's state (``who``: the ``Runtime``: its method, the setting
    that returns the step, and its compressor, for messages)."""

    def __init__(self, who):
        self.who = who
        self.owners = {}  # key -> weakref to the parameter whose state is stored under key
        self.checked = weakref.WeakSet()  # optimizers whose parameter lists were agreed
        self.last_checked = _dead_ref  # a weakref to the one checked last (a per-tensor fast path)
        self.direct = {}  # name -> whether a direct call of that name is a one-off (exact)

    def claim(self, key, owner, mid_step):
        """Record ``owner`` (a parameter or variable, or None) as the owner of ``key``'s state.

        Returns None (nothing to do), ``FRESH`` (every parameter seen so far is gone and a step
        is not under way (``mid_step`` False): a new training, e.g. the next run of a
        learning-rate sweep with the bare class; the caller starts from empty state, as a new
        instance would, and claims ``key`` again there) or ``FORGET`` (this key's earlier
        parameter is gone: drop its state).
        Raises ``HvdcompError`` when another live parameter holds the name (two optimizers
        sharing one compressor)."""
        if owner is None:
            return None
        known = self.owners.get(key)
        if known is not None and known() is owner:  # every step after the first
            return None
        verdict = None
        if known is not None:
            if known() is not None:
                gc.collect()  # the earlier model may be held only by reference cycles
            if known() is not None:
                name = type(self.who.compressor).__name__
                raise HvdcompError(
                    f"{self.who.method}: two different parameters are both named {key!r} in one "
                    "compressor, so their state would mix. When several optimizers share a "
                    f"compressor, give each its own instance: compression=hvdcomp.{name}().")
            gone = all(ref() is None for ref in self.owners.values())
            verdict = FRESH if gone and not mid_step else FORGET
        if verdict == FRESH:
            self.owners = {}
        self.owners[key] = weakref.ref(owner)
        return verdict

    def one_off(self, identity, adapter):
        """Whether the tensor ``identity`` names comes from a direct call
        (``hvd.allreduce(t, name=..., compression=...)``: no optimizer, no parameter; eager
        front ends) of a one-off value the user reads, such as a metric, rather than a
        gradient of their own loop: its name was first seen once this compressor already
        served an optimizer's gradients. Such a call is summed exactly by Horovod (error
        feedback would give a one-off value the error of a compressed message, and a value
        sent again and again its accumulated memory). A compressor that serves direct calls
        only compresses them as gradients, and warns once (``checks.direct_call_compressed``).
        Decided per name, once, the same on every rank."""
        if (identity.optimizer is not None or identity.owner is not None
                or identity.call is not None or getattr(adapter, "DEFERRED", False)):
            return False
        key = identity.name
        verdict = self.direct.get(key)
        if verdict is None:
            verdict = self.direct[key] = bool(self.owners)
            if not verdict and len(self.direct) == 1:
                checks.direct_call_compressed(self.who.method, key, world_rank())
        return verdict

    def check_parameters(self, context, adapter, optimizer):
        """At ``optimizer``'s first gradient, before Horovod can stall on a tensor some rank
        never submits: the optimizer must suit the compressor (``checks.inner_optimizer``), a
        resumed optimizer meeting an empty compressor is warned about
        (``checks.resumed_without_state``), and
        every rank of ``context()`` (the compressor's ``CommContext``, asked for
        only when there is something to check) must reduce the same parameters
        (``RankMismatchError`` naming the differences otherwise). One small all-gather, once per
        optimizer."""
        if optimizer is None or optimizer is self.last_checked():
            return
        if optimizer in self.checked:
            self.last_checked = weakref.ref(optimizer)
            return
        kind = getattr(adapter, "optimizer_kind", None)
        drivable = getattr(adapter, "drivable_adam", None)  # preconditioning.ThroughAdam's
        found = None if kind is None or (drivable and drivable(optimizer)) else kind(optimizer)
        momentum = getattr(adapter, "sgd_momentum", lambda optimizer: 0.0)(optimizer)
        if self.who.algorithm.under_sgd_momentum(momentum) and found is not None and momentum:
            found = None  # the compressor adapts to SGD's momentum (BinSGDM)
        checks.inner_optimizer(self.who.method, self.who.returns_step(), found, world_rank())
        steps = getattr(adapter, "optimizer_steps", None)
        if steps is not None and self.who.engine.step == 0 and not self.who.store.keys():
            checks.resumed_without_state(self.who.method, steps(optimizer), world_rank())
        names = adapter.parameter_names(optimizer)
        if names is not None:
            checks.agree_names(context(), names, self.who.method,
                               "the parameters their optimizer reduces")
        self.checked.add(optimizer)
        self.last_checked = weakref.ref(optimizer)


def process_set_ranks(process_set):
    """The sorted world ranks of a Horovod ``process_set``, or None for every rank."""
    ranks = getattr(process_set, "ranks", None)
    if ranks is None:
        return None
    known = _RANKS.get(id(ranks))  # asked once per tensor per step: remembered per ranks list
    if known is None or known[0] is not ranks:
        known = _RANKS[id(ranks)] = (ranks, None if len(ranks) == world_size()
                                     else tuple(sorted(ranks)))
    return known[1]


def _dead_ref():
    return None


_RANKS = {}  # id(a process set's ranks list) -> (that list, process_set_ranks' answer)
