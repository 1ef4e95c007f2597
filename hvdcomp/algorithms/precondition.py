"""'rms' preconditioning: each rank divides its gradient by its own running root mean square,
per coordinate, before the gradient is compressed.

Why: Adam divides each coordinate by the root of the running mean of its squared gradient. Fed
a compressed gradient, that second moment measures the compression instead of the gradient: a
1-bit aggregate has one magnitude per tensor, so Adam's per-coordinate scaling is lost and its
update becomes a per-tensor-normalised SGD; a sparse aggregate (rare large values) inflates it.
Normalising *before* compression keeps that scaling: the compressed quantity is already the
per-coordinate-normalised gradient, whose mean over ranks the optimizer then receives.

Per step t (counted per tensor, from 1), on every rank, for one gradient vector g:

    v_t = beta2 * v_{t-1} + (1 - beta2) * g**2                       (v_0 = 0; this rank's)
    u_t = g / (sqrt(v_t / (1 - beta2**t)) + eps)                      (Adam's bias correction)

The all-reduce then averages u (compressed, with the method's error feedback in u's units), so
the result has about unit root mean square per coordinate whatever the gradient's scale: the
optimizer's learning rate is a per-element step size, as for Adam (which, given u, still adds
its momentum and a per-tensor normalisation). v never leaves the rank: nothing extra is sent.
"""
from hvdcomp.backend import xp

BETA2 = 0.999
EPS = 1e-8


def step(state, g, beta2=BETA2, eps=EPS, out=None):
    """``(u, new_state)``: ``u = g / (sqrt(v_hat) + eps)`` (like ``g``) and this step's
    ``(t, v)``. ``state`` is the previous step's ``(t, v)`` (None at first) and is not
    modified, so a step that is rolled back or skipped leaves it intact. ``out``: ``(v, u)``,
    buffers like ``g`` to write them into (neither may be ``state``'s v or ``g``); by default
    fresh arrays. The same operations either way, so the same numbers."""
    t = 1 if state is None else int(state[0]) + 1
    v, u = out if out is not None else (xp.empty_like(g), xp.empty_like(g))
    xp.multiply(g, g, out=v)
    v *= 1.0 - beta2
    if state is not None:
        v += xp.multiply(state[1], beta2, out=u)
    denom = xp.sqrt(xp.multiply(v, 1.0 / (1.0 - beta2 ** t), out=u), out=u)
    denom += eps
    return xp.divide(g, denom, out=u), (t, v)
