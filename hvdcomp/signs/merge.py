"""Marsit: sign bits merged without bias at every hop of a ring all-reduce, with global
(or hybrid, the default) compensation.

Per step, on every rank j, for one (fused) gradient vector g of length d:

1. ``p = g + e``                      (e: this rank's compensation memory, zero at first)
2. ``s = pack_signs(p)``              (1 bit per element, see backend.bits for the layout)
3. ring reduce-scatter of ``s`` with ``MarsitMerge``: a chunk that already aggregates k ranks
   arrives at rank j, which keeps each incoming bit with probability k/(k+1) and takes its own
   bit with probability 1/(k+1). After size-1 hops every bit is the bit of one rank chosen
   uniformly at random, so E[±1 value] = mean over ranks of sign(p_i). The all-gather forwards
   finished chunks unchanged.
4. ``delta = mean over ranks of ||p_i||_1 / d`` (a scalar per tensor, exchanged as metadata)
5. the step every rank applies is ``delta * b`` (b: the aggregated ±1 vector), and the new
   memory is ``e = p - (1 - a) * delta * b - a * s_j * sign(p)`` with ``a`` the local share:
   - ``a = 0``, 'global' (the paper's): the error against the step applied globally. Each rank's
     memory then also keeps its own gradient noise: ``e_j - e_i`` is the sum of ``g_j - g_i``
     over all steps, a random walk that grows without bound (see
     benchmarks/marsit_compensation_sim.py).
   - ``a = 1``, 'local' (EF-signSGD): the error of this rank's own message; bounded, but the
     merge noise is left uncompensated and early progress is slower.
   - ``a = 0.1``, 'hybrid' (hvdcomp's default): 90% of the global error plus 10% of the local
     one. The local share pulls each memory back towards the rank's own message, so the spread
     stays bounded, while most of the merge error is still compensated.

The gradients here are the raw gradients: the learning rate is applied later by the user's
optimizer, so ``p = g + e`` plays the role of the paper's ``lr * g + e`` for a constant rate.
"""
import numpy as np

from hvdcomp.backend import bernoulli_mask, merge_bits, pack_signs, unpack_signs, xp

# The local share ``a`` of each compensation variant (module docstring, step 5).
LOCAL_SHARE = {"global": 0.0, "hybrid": 0.1, "local": 1.0}


def compensate(grad, memory):
    """``p = grad + memory`` (``memory`` None means zero); same kind/device as ``grad``."""
    return grad if memory is None else grad + memory


def l1_scale(p, total=None):
    """``||p||_1 / d`` as a Python float (0.0 for an empty vector); ``total``: ``sum |p|``
    when already known (e.g. from a fused kernel), else summed here."""
    if not p.shape[0]:
        return 0.0
    return (xp.abs_sum(p) if total is None else total) / p.shape[0]


def global_scale(scales):
    """The common step size: the mean of the ranks' l1 scales, summed in rank order (float64),
    so every rank computes the same number bit for bit."""
    return float(np.sum(np.asarray(scales, dtype=np.float64)) / len(scales))


def encode(p):
    """The message: packed sign bits of ``p`` (uint8, ceil(d/8) bytes)."""
    return pack_signs(p)


def decode(packed, d, dtype="float32"):
    """The aggregated ±1 vector ``b`` (length ``d``) from the packed message."""
    return unpack_signs(packed, d, dtype)


def apply(signs, delta, p, p_is_scratch=False, local_share=0.0, local=None):
    """``(step, new_memory)``: ``step = delta * signs`` is applied by every rank, and the memory is
    ``e = p - (1 - a) * step - local`` with ``a = local_share`` and ``local = a * s * sign(p)``
    (``own_message(p, a * s)``, computed by the caller before ``p`` is overwritten; ignored when
    ``a`` is 0, the global memory ``e = p - step``).

    ``signs`` is consumed: the step is computed in its storage (``decode`` returns a fresh
    array); every element of the step is exactly ``+-delta`` (in ``signs``' dtype). ``p`` is
    overwritten with the new memory when ``p_is_scratch`` (the caller owns it, e.g.
    ``compensate`` allocated it); otherwise the memory is a new array and ``p`` (which may be the
    user's gradient) is left as it is. ``local`` is only read. Two passes over the vector for
    the global memory, five with a local share.
    """
    step = signs
    step *= memory_factor(delta, local_share)
    if p_is_scratch:
        p -= step
        memory = p
    else:
        memory = p - step
    if local_share:
        memory -= local
        xp.set_magnitude(step, delta)  # (1 - a) * delta * b -> delta * b, exactly
    return step, memory


def memory_factor(delta, local_share):
    """The step's factor in the memory, ``(1 - a) * delta`` (``delta`` itself when ``a`` is 0),
    as a Python float."""
    return (1.0 - local_share) * delta if local_share else delta


def own_message(p, own_scale, out=None):
    """This rank's own 1-bit message as values, ``own_scale * sign(p)`` with the IEEE sign, as
    in the packed message (+0.0 gives ``+own_scale``, -0.0 ``-own_scale``), written into ``out``
    (scratch with ``p``'s shape, dtype and kind) or into a fresh array. Two passes."""
    return xp.signed_constant(p, own_scale, xp.empty_like(p) if out is None else out)


class MarsitMerge:
    """The per-hop combine of the ring reduce-scatter for packed sign bits.

    ``__call__(incoming, own, hops, chunk)``: ``incoming`` aggregates ``hops`` ranks; keep each
    of its bits with probability hops/(hops+1), else take ``own``'s. The mask comes from the
    counter-based source keyed by (seed, step, rank, chunk, *extra) (``extra``: e.g. the bucket
    index within the step), so a rerun with the same key
    (e.g. after a checkpoint restore) makes the same choices.
    """

    def __init__(self, seed, step, rank, extra=()):
        self.seed, self.step, self.rank = int(seed), int(step), int(rank)
        self.extra = tuple(int(x) for x in extra)

    def __call__(self, incoming, own, hops, chunk):
        key = (self.seed, self.step, self.rank, chunk) + self.extra
        mask = bernoulli_mask(key, incoming.size, 1.0 / (hops + 1))
        return merge_bits(incoming, own, mask)
