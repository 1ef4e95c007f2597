"""'adam' preconditioning: the compressor carries Adam's state, and what is compressed is each
rank's momentum, not its gradient.

Why: error feedback makes a compressed all-reduce lose nothing in the long run for an optimizer
that is linear in the gradients (SGD, momentum), but Adam divides by a second moment taken from
the compressed values, which then measures the compression. Following 1-bit Adam (Tang et al.,
2021), the momentum is what crosses the network (error feedback then compensates what Adam
actually applies) and the second moment comes from a dense warm-up. After the warm-up the second
moment follows the synchronised momentum, ``v = b2 v + (1-b2) m**2`` (AdaMomentum's second
moment, Wang et al., 2021), so it stays defined by values every rank holds.

State per tensor, the same on every rank: ``(t, m, v)`` (t: steps taken, m, v: like the
gradient). Per step, with ``g_r`` rank r's gradient:

    warm-up (t < warmup): each rank sends g_r, all-reduced densely; gbar = mean_r g_r
        m = b1 m + (1-b1) gbar;   v = b2 v + (1-b2) gbar**2
    afterwards: each rank sends m_r = b1 m + (1-b1) g_r through the method's compressed mean
        (with its own error feedback); m = that mean;   v = b2 v + (1-b2) m**2
    both: t = t + 1;   u = (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)

``u`` is what the compressor returns: Adam's step direction. The user's optimizer must therefore
be plain SGD without momentum at Adam's learning rate (``x -= lr * u``), as for BinSGDM. With
``warmup = inf`` this is exactly Adam on the dense mean gradient (tested against
``torch.optim.Adam``). Nothing but the message itself is sent: m and v never leave the rank.
"""
import math

from hvdcomp.algorithms import moment_constants
from hvdcomp.backend import xp

BETAS = (0.9, 0.999)
EPS = 1e-8
WARMUP = 10


class AdamSettings:
    """The constants of precondition='adam': ``betas`` (b1, b2), ``eps`` and ``warmup``: the number
    of dense steps (per tensor, >= 1) before its momentum is compressed; ``math.inf`` never
    compresses (plain Adam, for comparisons). The second moment needs at least one dense step:
    started from compressed momentum alone, its bias correction makes the first steps
    1/(1-b1) times too large."""

    def __init__(self, betas=BETAS, eps=EPS, warmup=WARMUP):
        self.betas, self.eps = moment_constants(betas, eps)
        if not (warmup == math.inf or (isinstance(warmup, int) and not isinstance(warmup, bool)
                                        and warmup >= 1)):
            raise ValueError(f"warmup must be an int >= 1 (or math.inf), got {warmup!r}")
        self.warmup = warmup

    def __repr__(self):
        return f"AdamSettings(betas={self.betas}, eps={self.eps}, warmup={self.warmup})"


def is_dense(state, settings):
    """True when this step of the tensor whose state is ``state`` (None at first) is a warm-up
    step: its message is all-reduced uncompressed."""
    return (0 if state is None else int(state[0])) < settings.warmup


def message(state, g, settings, out=None):
    """What this rank sends for gradient ``g``: ``g`` itself in a warm-up step, else its momentum
    ``b1 m + (1-b1) g`` (``state`` is not modified). ``out``: ``(message, work)``, buffers like
    ``g`` for the momentum and a temporary (neither may be ``state``'s or ``g``); by default
    fresh arrays. The same operations either way, so the same numbers."""
    if is_dense(state, settings):  # always so for state None: warmup >= 1
        return g
    b1 = settings.betas[0]
    msg, work = out if out is not None else (xp.empty_like(g), xp.empty_like(g))
    xp.multiply(g, 1.0 - b1, out=msg)
    msg += xp.multiply(state[1], b1, out=work)
    return msg


def update(state, reduced, dense, settings, out=None):
    """``(u, new_state)`` from ``reduced``, the mean over ranks of this step's messages (``dense``:
    whether it was a warm-up step, i.e. the mean gradient rather than the new momentum). ``u`` is
    Adam's step direction; ``state`` is not modified, so a step that does not land leaves it
    intact. ``out``: ``(m, v, work)``, buffers like ``reduced`` for the new moments and a
    temporary (none of them ``state``'s or ``reduced``); then ``u`` is written into ``reduced``
    itself. By default fresh arrays (``reduced`` is not modified). The same numbers either way."""
    (b1, b2), eps = settings.betas, settings.eps
    t = 1 if state is None else int(state[0]) + 1
    m, v, work = out if out is not None else (xp.empty_like(reduced) for _ in range(3))
    if dense:
        xp.multiply(reduced, 1.0 - b1, out=m)
        if state is not None:
            m += xp.multiply(state[1], b1, out=work)
        xp.multiply(reduced, reduced, out=v)
    else:
        xp.add(reduced, 0.0, out=m)  # the compressed mean is the new momentum
        xp.multiply(m, m, out=v)
    v *= 1.0 - b2
    if state is not None:
        v += xp.multiply(state[2], b2, out=work)
    denom = xp.sqrt(xp.multiply(v, 1.0 / (1.0 - b2 ** t), out=work), out=work)
    denom += eps
    u = xp.multiply(m, 1.0 / (1.0 - b1 ** t), out=reduced if out is not None else None)
    u /= denom
    return u, (t, m, v)
