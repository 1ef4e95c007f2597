"""BinSGDM (published as Birder): one-bit momentum with unbiased stochastic binarisation.

Per step, on every rank, for one gradient vector g (1-D, float32; NumPy or Torch):

1. ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*|g|``; at a tensor's first step the state is
   initialised with the gradient itself (``m = g``, ``v = |g|``), so there is no zero-init bias to
   correct and no warm-up.
2. ``u = clip(m / (v + eps), -1, 1)``.
3. ``q = +1`` with probability ``(1+u)/2`` else ``-1`` (int8), so ``E[q] = u``; the random numbers
   come from ``backend.stochastic`` keyed by (seed, step, rank, VOTE).
4. The ranks' votes are summed (exactly inside a node; between nodes each node's sum ``s`` of
   ``L`` votes is re-binarised without bias, ``b = +1`` w.p. ``(1 + s/L)/2``, and ``L*b`` stands
   for ``s``), and every rank gets the mean vote ``sum / size`` in [-1, 1].
5. The step is ``clip(c * mean_q, -1, 1)`` under the user's Adam (its moments set so that its
   update is ``lr`` times it; ``c`` is ``adam_scale``), and ``s * mean_q`` under plain SGD, with
   ``s`` the ranks' mean of the tensor's mean ``v`` (``normaliser_mean``), so that SGD's usual
   learning rate applies:
   ``x -= lr * (s * mean_q + wd * x)``.

Defaults ``b1 = b2 = 0.9``. With equal betas and this initialisation, ``|m| <= v`` holds
element-wise by the triangle inequality (m and v are the same weighted sums of g and |g|), so
``u`` lies in [-1, 1] without clipping and is the consistency of the gradient's sign over the
momentum window (about 10 steps): a coordinate whose gradient keeps its sign votes +1/-1
deterministically, a noisy one votes close to a coin flip. A slower normaliser (b2 = 0.999, as
Adam's second moment) makes ``v`` lag the gradient scale: ``u`` then saturates when gradients
grow (clipping is what keeps it in range) and shrinks as they decay (an implicit learning-rate
decay). Both are allowed; clipping is always applied, which is a no-op when b1 == b2 (up to
rounding).
"""
import math

import numpy as np

from hvdcomp.methods.binsgdm.stochastic import stochastic_signs
from hvdcomp.backend.xp import _torch, from_host, is_torch

VOTE, REBINARISE = 0, 1  # stage tags in the random keys
SAMPLES = 16  # normalised gradient elements per tensor each rank sends under Adam (``adam_scale``)
_SPREAD = 2654435761  # a prime: ``sample_positions`` visits distinct positions


def sample_positions(numel):
    """The ``min(numel, SAMPLES)`` positions of a tensor whose gradient elements each rank sends
    under Adam: spread over the tensor (not along one column of a matrix), the same on every
    rank and every step (int64 NumPy)."""
    return (np.arange(min(numel, SAMPLES), dtype=np.int64) * _SPREAD) % max(numel, 1)


def normalised_samples(g, state, b2, eps, positions):
    """``g / (v + eps)`` at ``positions``, with ``v`` the normaliser after ``g`` (``state``: the
    previous ``(m, v)`` or None), as ``SAMPLES`` float64 host values, zeros after
    ``len(positions)`` (``g`` flat, NumPy or Torch on any device)."""
    def at(x):
        if is_torch(x):
            return x[_torch().as_tensor(positions, device=x.device)].double().cpu().numpy()
        return np.asarray(x[positions], dtype=np.float64)
    grad = at(g)
    v = np.abs(grad) if state is None else b2 * at(state[1]) + (1 - b2) * np.abs(grad)
    out = np.zeros(SAMPLES)
    out[:len(positions)] = grad / (v + eps)
    return out


def adam_scale(mean_samples, count, size):
    """The factor ``c`` of the step under the user's Adam (``clip(c * mean_q, -1, 1)``), a
    Python float in ``[1, sqrt(size)]``: one over the root mean square of the ranks' mean
    ``normalised_samples`` (``mean_samples``; the first ``count`` are real).

    Why: each rank's vote follows its own ``m / v``, whose ``v`` measures one rank's gradient,
    while the user's Adam normalises by the ranks' *mean* gradient: where the ranks' gradients
    are mostly noise that mean is up to ``sqrt(size)`` smaller than each rank's (its normalised
    samples' root mean square about ``1 / sqrt(size)``), and the mean vote's step as much
    smaller than Adam's. Where the ranks agree each normalised sample is about +-1 and ``c``
    is 1 (the mean vote is then already Adam's bounded step); 1 where nothing was measured."""
    mean = np.asarray(mean_samples[:count], dtype=np.float64)
    square = float(np.dot(mean, mean)) / max(count, 1)
    if not (square > 0.0 and math.isfinite(square)):
        return 1.0
    return min(max(1.0 / math.sqrt(square), 1.0), math.sqrt(size))


def update_moments(g, state, b1, b2):
    """``(m, v)`` after gradient ``g``; ``state`` is the previous ``(m, v)`` or None (first step).
    New arrays of ``g``'s kind, dtype and device; ``state`` is not modified."""
    if state is None:
        return g * 1, abs(g)
    m, v = state
    return m * b1 + g * (1 - b1), v * b2 + abs(g) * (1 - b2)


BLOCK = 1 << 16  # elements per block of a host sum of |g| (no full-size temporary)


def normaliser_mean(g, state, b2, v_total=None):
    """The mean of ``v`` after gradient ``g`` (``update_moments``'s, without computing it), a
    Python float: ``mean|g|`` at the first step, else ``b2 mean(v) + (1-b2) mean|g|``. Averaged
    over the ranks it is the scale of the step under SGD (``hvdcomp.methods.binsgdm.method``). Host arrays are
    read in blocks: nothing gradient-sized is allocated. ``v_total``: ``total(state[1])`` where
    the caller knows it already (else it is summed here)."""
    n = max(int(g.shape[0]), 1)
    if is_torch(g):
        g_mean = float(g.abs().sum()) / n
    else:
        g_mean = sum(float(np.abs(g[i:i + BLOCK]).sum(dtype=np.float64))
                     for i in range(0, g.shape[0], BLOCK)) / n
    if state is None:
        return g_mean
    if v_total is None:
        v_total = total(state[1])  # state[1]: v >= 0
    return b2 * v_total / n + (1 - b2) * g_mean


LANES = 16  # the lanes of a host array's ``total``


def total(x):
    """The sum of the elements of ``x`` as a Python float: a torch tensor's own ``sum``; a 1-D
    NumPy array's in float64, in *lanes*: lane ``l`` is the sum of the elements ``i`` with
    ``i % LANES == l`` taken in order, and the total adds lanes 0, 1, ... in order. That order is
    the fused kernels' (``hvdcomp.methods.binsgdm.kernels``), which sum the moment ``v`` as they write it
    (a pass over ``v`` saved per step), so both paths give the same bits."""
    if is_torch(x):
        return float(x.sum())
    x = np.asarray(x).reshape(-1)
    full = x.shape[0] - x.shape[0] % LANES
    # a reduction over axis 0 of a C-ordered (rows, LANES) array adds its rows in order
    lanes = np.zeros(LANES) if full == 0 else np.sum(x[:full].reshape(-1, LANES), axis=0,
                                                     dtype=np.float64)
    lanes[:x.shape[0] - full] += x[full:]
    out = 0.0
    for lane in lanes.tolist():  # in order (Python's sum() compensates: another order)
        out += lane
    return out


def direction(m, v, eps):
    """``u = clip(m / (v + eps), -1, 1)``, like ``m``."""
    u = m / (v + eps)
    return u.clamp(-1.0, 1.0) if is_torch(u) else np.clip(u, -1.0, 1.0)


def binarise(u, key):
    """Unbiased ±1 votes (int8, like ``u``): +1 with probability (1+u)/2, so E[q] = u."""
    return stochastic_signs((u + 1) * 0.5, key)


def rebinarise(node_sum, node_size, key):
    """Unbiased ±1 (int8 NumPy) for a node's sum ``s`` of ``node_size`` ±1 votes: +1 with
    probability ``(1 + s/L)/2``, so ``E[L * b] = s``. Exact (deterministic) where ``|s| = L``,
    hence the identity for nodes of one rank."""
    s = np.asarray(node_sum, dtype=np.float64)
    return stochastic_signs((s + node_size) / (2.0 * node_size), key)


def node_votes_total(bits, node_size, dtype):
    """The estimate of the sum over all ranks from the nodes' re-binarised messages:
    ``sum_n L * b_n`` where ``bits`` is (nodes, n) ±1 (int8), in integer ``dtype`` (exact)."""
    return (np.asarray(bits).sum(axis=0, dtype=np.int64) * int(node_size)).astype(dtype)


def mean_vote(total, size, like=None):
    """``total / size`` as float32 (the decompressed mean vote in [-1, 1]); like ``like``. For a
    device ``like`` the integer totals travel (a quarter of the result's bytes or less) and the
    division runs there, giving the host's numbers."""
    if is_torch(like) and not like.is_cpu:
        torch = _torch()
        return (from_host(total, like).to(torch.float64) / size).to(torch.float32)
    out = (np.asarray(total, dtype=np.float64) / size).astype(np.float32)
    return from_host(out, like) if like is not None else out
