"""``hvdcomp.Marsit``: 1 bit per element on every hop of a ring all-reduce, with error
compensation (algorithm in ``hvdcomp.signs.merge``).

Per flush, the packed sign bits of all large gradients are fused into one byte buffer (each
tensor starts on a byte boundary, so no float copy of the gradients is made), and one ring
all-reduce carries the whole step; each rank sends ``2 (size-1)/size * sum(ceil(d_i/8))`` bytes
plus a few scalars. State per tensor: the compensation memory ``e`` (same dtype/device as the
working gradient; ``hvdcomp.feedback``): the step's compensated gradient is written into the
store's spare buffer and overwritten in place by its residual, which becomes the new memory when
the step lands. The 'hybrid' and 'local' memories also keep one work vector per tensor (the
rank's own message as values; not state). Host (NumPy/CPU) tensors run the fused kernels of
``hvdcomp.kernels`` (encode and decode one pass each, same numbers; ``HVDCOMP_KERNELS=numpy``
selects the reference path).
"""

from hvdcomp import feedback, validate
from hvdcomp.signs import message as signmsg
from hvdcomp.signs import merge as alg
from hvdcomp.backend import xp
from hvdcomp.backend.bits import packed_nbytes
from hvdcomp.comm import ring_allreduce
from hvdcomp.methods.contract import Method
from hvdcomp.signs import KERNELS as signs_kernels


def decode_fused(batch, entry, bits, delta, share):
    """``(step, memory)`` of one tensor by the fused kernel (``hvdcomp.signs.kernels``), the
    numbers of ``alg.apply`` bit for bit: ``bits`` its merged packed bits (host uint8), ``share``
    the local share ``a``. The memory overwrites ``entry.compensated`` when owned."""
    from hvdcomp.signs import kernels as signs
    p, step, memory = signmsg.decode_buffers(batch, entry)
    signs.marsit_decode(bits, p, delta, alg.memory_factor(delta, share),
                        share * entry.own_scale if share else None, step, memory)
    return step, memory


class Marsit(Method):
    """Marsit compression for ``hvd.DistributedOptimizer(..., compression=hvdcomp.Marsit)``.

    Args:
        compensation: 'hybrid' (default: 90% of the global error plus 10% of the local one),
            'global' (the paper's: ``e = p - delta * b``, the error against the step applied by
            every rank; each rank's memory also keeps its own gradient noise as a random walk,
            which grows without bound on long runs) or 'local' (EF-signSGD style:
            ``e = p - s * sign(p)`` with this rank's own scale s; the merge noise is then left
            uncompensated). Formulas in ``hvdcomp.signs.merge``; the three in
            docs/options.md.
        seed: seed of the merge masks (with the step, rank and chunk: reproducible runs).
        min_compress_numel, on_nonfinite, fusion, fusion_cost, precondition: as for every
            hvdcomp compressor (``hvdcomp.facade.BatchedCompressor``); precondition: None
            (default), 'rms', or 'adam' / ``hvdcomp.AdamSettings(...)``, for Adam users
            (docs/methods.md, "With Adam or AdamW").
    """

    name = "Marsit"
    n_scalars = 1  # the l1 scale ||p||_1 / d of each tensor
    kernel_modules = (signs_kernels,)

    def __init__(self, *, compensation="hybrid"):
        self.compensation = validate.choice("compensation", compensation, tuple(alg.LOCAL_SHARE))

    def settings(self):
        return {"compensation": self.compensation}

    def prepare(self, batch):
        for e in batch.entries:
            e.own_scale = signmsg.compensate(batch, e)
        return [[e.own_scale] for e in batch.entries]

    def reduce(self, batch, scalars):
        ctx = batch.ctx
        with batch.phase("encode"):
            packed = signmsg.message(batch)
        with batch.phase("comm"):
            ring_allreduce(ctx, packed, alg.MarsitMerge(self.seed, batch.step, ctx.rank,
                                                           batch.key()))
        share = alg.LOCAL_SHARE[self.compensation]
        out, off = [], 0
        with batch.phase("decode"):
            for i, e in enumerate(batch.entries):
                p, nbytes = e.compensated, packed_nbytes(e.numel)
                delta = alg.global_scale(scalars[:, i, 0])
                if signmsg.fused(e):
                    step, memory = decode_fused(batch, e, packed[off:off + nbytes], delta, share)
                else:
                    signs = alg.decode(xp.from_host(packed[off:off + nbytes], p), e.numel)
                    local = (alg.own_message(p, share * e.own_scale,
                                             out=batch.store.scratch(e.key, p)) if share else None)
                    step, memory = alg.apply(signs, delta, p, e.owned, share, local)
                feedback.keep(batch, e, memory)
                out.append(step)
                off += nbytes
        return out
