"""How a method whose result is the optimizer's step itself steps aside where the compress-or-pass
decision passes a tensor (``hvdcomp.decision``): BinSGDM.

Passing a tensor usually means summing its gradient exactly. For a method whose result is the
step (``Method.returns_step``: BinSGDM's normalised momentum vote) the exact sum of the gradient is
not the step its optimizer expects, so such a method could not pass, and where the wire is fast
it was slower than Horovod's own allreduce. A method that can step aside provides
``exact_parts(work, key, store, out)``: from this rank's working gradient (flat) of tensor ``key``
and its state in ``store``, it writes into ``out`` (like ``work``) the *direction* ``u`` whose
mean over the ranks is the expectation of its compressed result, and returns a float *scale*
``s`` (finite exactly where ``work`` is) and its new state (which the caller stages, or holds
until the result is known to be finite). BinSGDM's ``u`` is ``clip(m / v)`` of the rank's
updated moments (its votes are unbiased ±1 draws of it) and ``s`` the mean of ``v``.

What is sent: the *message* ``[u, s, 1, z]`` (``numel + 3`` elements, float32, or the gradient's
float64 through Horovod; ``z`` is 1 where this rank's gradient is all zeros; under the user's
Adam followed by the method's ``adam_samples`` of the gradient), summed exactly, by
Horovod's own allreduce where ``compress()`` may hand it over (``hvdcomp.facade.horovod_sums``:
torch optimizers, one batch per step, unscaled gradients; under Adam too, its
moments set as the step is handed back, ``hvdcomp.facade.runtime.Runtime.stepped``),
overlapping the backward pass as Horovod's allreduce of the gradient does; else by the step
engine's float sum (``hvdcomp.engine``: TensorFlow, LayerFusion, scaled gradients). From the
reduced message ``r`` (the mean times Horovod's op factor ``f``, which the constant 1 carries)
the step is ``r[:n]`` (``f`` times the mean direction) for a direct allreduce, that as the
method's ``adam_step`` scales it (clipped to ``f`` times [-1, 1]) under the user's Adam
(``hvdcomp.preconditioning.ThroughAdam`` makes Adam's update ``lr`` times it), and
``r[:n] * r[n] / r[n + 1]`` (``f`` times the mean direction times the ranks' mean scale) under
SGD: exactly the expectation of the compressed step, without its variance, the
same on every rank since every rank reduces the same message. Where ``r[n + 2] == r[n + 1]`` the
gradient was all zeros on every rank (Horovod's zero fill of a gradient nobody computed): the
step is zero and the state waits, as the step engine does for such an *absent* tensor.

The state is the method's own, per rank, exactly as in its compressed steps (BinSGDM's moments
are the rank's own either way), so a tensor that switches between compressed and passed steps
loses nothing and needs no carry. Through Horovod, the new state is held until ``decompress``
sees the result: it is committed where ``r[n]`` is finite (no rank's gradient was NaN/Inf), the
tensor was not absent and the step was not skipped, and dropped otherwise, the same on every
rank; each tensor's as its result is handed back (a step that raises between two of them keeps
the earlier ones'), where the step engine commits a step's state at once. On a step that hvdcomp
does not agree on (``hvdcomp.engine.QuietSteps``, NaN propagated), a tensor with a non-finite
gradient on some rank thus keeps its state on every rank while the others' advance, where an
agreed step under ``on_nonfinite='propagate'`` keeps every tensor's state; its step is NaN in
every element (the direction ``u`` of a rank whose gradient was not finite may be finite, as
its moments are held: only ``r[n]`` shows it), as Horovod's own sum would hand the NaN on.
"""
import math

import numpy as np

from hvdcomp.backend import xp


def applies(method):
    """Whether ``method`` (a method, or the engine's wrapper of it) steps aside this way."""
    return getattr(method, "exact_parts", None) is not None


def message(method, work, key, store, adam=False):
    """``([u, s, 1, z]`` like ``work`` (numel + 3; under the user's Adam, ``adam``, followed by
    the method's ``adam_samples``), the new state) of ``work`` (the rank's flat working gradient
    of tensor ``key``) and its state in ``store`` (``exact_parts``). The message is written into
    ``store.outgoing``'s buffer: Horovod sums it in place and its step is a view of it, so it
    is reused once the user's gradient no longer holds it."""
    n = work.shape[0]
    extra = method.adam_samples(work, key, store) if adam else ()
    sent = store.outgoing(key + "#message", work, n + 3 + len(extra))
    s, new_state = method.exact_parts(work, key, store, sent[:n])
    zero = n == 0 or (float(work[0]) == 0.0 and not bool(work.any()))
    sent[n], sent[n + 1], sent[n + 2] = s, 1.0, float(zero)
    if adam:
        sent[n + 3:] = xp.from_host(extra.astype(np.float32), sent)
    return sent, new_state


def under_sgd(entry):
    """Whether ``entry``'s step is applied by plain SGD (an optimizer's gradient, not under the
    user's Adam), which takes the direction times the mean scale."""
    return entry.adam is None and entry.gradient


def step(method, reduced, entry, size):
    """The step of ``entry`` (``hvdcomp.engine.Entry``; flat, like ``reduced``) from its reduced
    message ``reduced`` over ``size`` ranks: a view of it, scaled in place under SGD, and under
    the user's Adam by the method's ``adam_step`` (clipped to ``f`` times [-1, 1])."""
    n = entry.numel
    direction = reduced[:n]
    factor = float(reduced[n + 1])  # Horovod's op factor f
    if under_sgd(entry):
        direction *= float(reduced[n]) / factor
    elif entry.adam is not None:
        direction = method.adam_step(
            direction, xp.to_host(reduced[n + 3:]).astype(np.float64) / factor, size,
            abs(factor))
    return direction


def finite(reduced, numel):
    """Whether every rank's gradient behind the reduced message was finite (its scale is)."""
    return math.isfinite(float(reduced[numel]))


def absent(reduced, numel):
    """Whether the gradient behind the reduced message was all zeros on every rank."""
    return float(reduced[numel + 2]) == float(reduced[numel + 1])
