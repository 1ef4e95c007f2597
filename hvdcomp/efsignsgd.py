"""``hvdcomp.EFSignSGD``: EF-signSGD with majority vote, the classic 1-bit baseline.

Definition (per step, on every rank r, for one gradient vector g_r of length d):

    p_r   = g_r + e_r                     error compensation (e_r: this rank's memory, 0 at first)
    s_r   = ||p_r||_1 / d                 this rank's scale (a scalar, gathered with the metadata)
    sent  = sign(p_r)                     1 bit per element (IEEE sign bit: -0.0 votes -1)
    V     = sum_r sign(p_r)               the votes, counted by every rank from all ranks' bits
    step  = mean_r(s_r) * sign(V)         majority vote with a scale (a tie, V = 0, moves nothing)
    e_r   = p_r - s_r * sign(p_r)         the error of this rank's own 1-bit message

Sources: the majority vote is signSGD with majority vote (Bernstein, Zhao, Azizzadenesheli and
Anandkumar, "signSGD with Majority Vote is Communication Efficient and Fault Tolerant", ICLR
2019); the scaled sign with error feedback is EF-signSGD (Karimireddy, Rebjock, Stich and Jaggi,
"Error Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML 2019, Algorithm 1,
with the compressor ``C(p) = ||p||_1 / d * sign(p)``). The memory is each rank's own compression
error, as in EF-signSGD; what the vote then drops is not compensated (Marsit's 'global'/'hybrid'
memories do compensate it; this is the baseline to compare them with).

Under the user's Adam/AdamW (``hvdcomp.preconditioning.FollowAdam``: each rank sends its Adam
momentum, and the mean becomes Adam's momentum) the vote is replaced by the mean of the ranks'
scaled signs, ``step = mean_r(s_r * sign(p_r))``, from the same gathered bits and scales (the
same wire). Why: a voted momentum drifts, because what the vote drops is in no rank's memory
(char transformer under AdamW, recipe (c): +6.0% validation loss); with the mean, each rank's
whole error ``p_r - s_r sign(p_r)`` is in its own memory, so over steps the applied momenta sum
to the ranks' mean momentum, as Marsit's do (EF-signSGD of Karimireddy et al. with a mean in
place of their single worker).

Wire: the packed sign bits of all large tensors of a step (each tensor byte-aligned), plus one
scalar per tensor. With 2 ranks (or under Adam, whose scaled mean needs every rank's bits) they
are all-gathered: each rank sends ``(size-1) * sum(ceil(d_i/8))`` bytes, linear in size. With 3
ranks or more the vote's counts go along a ring instead (``hvdcomp.comm.votes``: exact counts
reduce-scattered in bit planes, the outcome all-gathered; 1.7 bits per element at 3 ranks, 2.75
at 4, 3.9 at 8, growing as log N, in 2 (N-1) rounds), the same step bit for bit. Results are
identical on every rank (every rank counts the same gathered bits, or the same two rows).
State per tensor: the memory ``e`` (``hvdcomp.feedback``). Host (NumPy/CPU) tensors run the
fused kernels of ``hvdcomp.kernels`` (same numbers; ``HVDCOMP_KERNELS=numpy`` selects the
reference path).
"""
import numpy as np

from hvdcomp import feedback, kernels, preconditioning, signmsg
from hvdcomp.backend import unpack_signs, xp
from hvdcomp.backend.bits import packed_nbytes
from hvdcomp.comm import votes
from hvdcomp.method import Method


def vote_total(rows, d, like=None):
    """``V``: the sum over ranks of the +-1 votes packed in ``rows`` (host uint8, one row per
    rank), int32; counted on ``like``'s device when ``like`` is a device tensor (the packed rows
    travel there, an eighth of the votes' bytes), else on the host."""
    if xp.is_torch(like) and not like.is_cpu:
        torch = xp._torch()
        rows = xp.from_host(rows, like)
        total = torch.zeros(d, dtype=torch.int32, device=like.device)
    else:
        total = np.zeros(d, dtype=np.int32)
    for row in rows:
        total += unpack_signs(row, d, "int8")
    return total


def scaled_mean(rows, scales, d, like=None):
    """``mean_r(scales[r] * sign_r)``, float32, the signs packed in ``rows`` (host uint8, one row
    per rank, summed in rank order: the same bits on every rank); on ``like``'s device when it
    is a device tensor, else on the host."""
    device = xp.is_torch(like) and not like.is_cpu
    total = (xp._torch().zeros(d, dtype=xp._torch().float32, device=like.device) if device
             else np.zeros(d, dtype=np.float32))
    for row, scale in zip(xp.from_host(rows, like) if device else rows, scales):
        signs = unpack_signs(row, d, "float32")
        signs *= float(np.float32(scale))
        total += signs
    total /= len(scales)
    return total


def majority_step(total, scale):
    """``scale * sign(total)`` as float32 (0 where the vote ties), of ``total``'s kind."""
    if xp.is_torch(total):
        step = total.sign().to(xp._torch().float32)
    else:
        step = np.sign(total).astype(np.float32)
    step *= float(np.float32(scale))
    return step


def own_error(p, own_scale, owned, scratch):
    """``p - own_scale * sign(p)`` (written into ``p`` when ``owned``, else a new array);
    ``scratch``: a work buffer like ``p``."""
    own = xp.signed_constant(p, own_scale, scratch)
    if owned:
        p -= own
        return p
    return p - own


def decode_fused(batch, entry, rows, off, scale):
    """The step of one tensor and its new memory (kept) by the fused kernel
    (``hvdcomp.kernels.signs.vote_decode``), the numbers of ``majority_step`` and
    ``own_error`` bit for bit: its bits start at byte ``off`` of each of ``rows``."""
    from hvdcomp.kernels import signs
    p, step, memory = signmsg.decode_buffers(batch, entry)
    signs.vote_decode(np.ascontiguousarray(rows), off, p, scale, entry.own_scale, step, memory)
    feedback.keep(batch, entry, memory)
    return step


def exchange(batch, packed, preconditioner):
    """The rows the decode counts: every rank's packed bits (an all-gather), or, where that
    moves more bits and only the vote is needed (no tensor sends Adam's momentum, whose scaled
    mean needs each rank's bits), the vote's exact outcome as two rows
    (``hvdcomp.comm.votes``: counts reduce-scattered along a ring, log N bits per element)."""
    ctx = batch.ctx
    if votes.ring_pays(ctx.size) and not any(
            preconditioning.sends_momentum(preconditioner, e) for e in batch.entries):
        return votes.vote_rows(ctx, packed)
    return ctx.allgather_array(packed, dtype=np.uint8)


class EFSignSGD(Method):
    """EF-signSGD with majority vote for ``hvd.DistributedOptimizer(...,
    compression=hvdcomp.EFSignSGD)`` (definition and sources in the module docstring).

    Args: the common ones of every hvdcomp compressor (``hvdcomp.facade.BatchedCompressor``):
    min_compress_numel, on_nonfinite, seed (unused: the method draws no random numbers), fusion,
    fusion_cost, precondition.
    """

    name = "EFSignSGD"
    n_scalars = 1  # this rank's scale ||p||_1 / d

    def __init__(self):
        kernels.warm("signs")

    def prepare(self, batch):
        for e in batch.entries:
            e.own_scale = signmsg.compensate(batch, e)
        return [[e.own_scale] for e in batch.entries]

    def reduce(self, batch, scalars):
        with batch.phase("encode"):
            packed = signmsg.message(batch)
        with batch.phase("comm"):
            rows = exchange(batch, packed, self.preconditioner)
        out, off = [], 0
        with batch.phase("decode"):
            for i, e in enumerate(batch.entries):
                p, nbytes = e.compensated, packed_nbytes(e.numel)
                mine, scales = rows[:, off:off + nbytes], scalars[:, i, 0]
                scale = np.sum(scales) / len(scales)
                if preconditioning.sends_momentum(self.preconditioner, e):
                    out.append(scaled_mean(mine, scales, e.numel, like=p))
                elif signmsg.fused(e):
                    out.append(decode_fused(batch, e, rows, off, scale))
                    off += nbytes
                    continue
                else:
                    out.append(majority_step(vote_total(mine, e.numel, like=p), scale))
                feedback.keep(batch, e, own_error(p, e.own_scale, e.owned,
                                                  batch.store.scratch(e.key, p)))
                off += nbytes
        return out
