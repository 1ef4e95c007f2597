"""``hvdcomp.Marsit``: 1 bit per element on every hop of a ring all-reduce, with error
compensation (algorithm in ``hvdcomp.algorithms.marsit``).

Per flush, the packed sign bits of all large gradients are fused into one byte buffer (each
tensor starts on a byte boundary, so no float copy of the gradients is made), and one ring
all-reduce carries the whole step; each rank sends ``2 (size-1)/size * sum(ceil(d_i/8))`` bytes
plus a few scalars. State per tensor: the compensation memory ``e`` (same dtype/device as the
working gradient); each step stores a new array (the step's compensated gradient, overwritten
in place by its residual), never mutating the previous one. The 'hybrid' and 'local' memories
also keep one work vector per tensor (the rank's own message as values; not state).
"""
import numpy as np

from hvdcomp.algorithms import marsit as alg
from hvdcomp.backend import xp
from hvdcomp.backend.bits import packed_nbytes
from hvdcomp.comm import ring_allreduce
from hvdcomp.compressor import BatchedCompressor, DEFAULT_MIN_COMPRESS_NUMEL


class Marsit(BatchedCompressor):
    """Marsit compression for ``hvd.DistributedOptimizer(..., compression=hvdcomp.Marsit)``.

    Args:
        min_compress_numel: tensors with fewer elements (biases, norms) are summed uncompressed.
        on_nonfinite: 'raise' (default) or 'skip' a step whose gradients hold NaN/Inf anywhere.
        seed: seed of the merge masks (with the step, rank and chunk: reproducible runs).
        compensation: 'hybrid' (default: 90% of the global error plus 10% of the local one),
            'global' (the paper's: ``e = p - delta * b``, the error against the step applied by
            every rank; each rank's memory also keeps its own gradient noise as a random walk,
            which grows without bound on long runs) or 'local' (EF-signSGD style:
            ``e = p - s * sign(p)`` with this rank's own scale s; the merge noise is then left
            uncompensated). Formulas in ``hvdcomp.algorithms.marsit``; measured accuracy of the
            three in the README.
        fusion, fusion_cost: LayerFusion bucketing, as for every hvdcomp compressor (see
            ``hvdcomp.compressor``).
        precondition: None (default), 'rms', or 'adam' / ``hvdcomp.AdamSettings(...)``: for
            Adam users, see ``BatchedCompressor`` and the README ("With Adam").
    """

    method = "Marsit"
    n_scalars = 1  # the l1 scale ||p||_1 / d of each tensor

    def __init__(self, *, min_compress_numel=DEFAULT_MIN_COMPRESS_NUMEL, on_nonfinite="raise",
                 seed=0, compensation="hybrid", fusion=None, fusion_cost=None, precondition=None):
        super().__init__(min_compress_numel=min_compress_numel, on_nonfinite=on_nonfinite,
                         seed=seed, fusion=fusion, fusion_cost=fusion_cost,
                         precondition=precondition)
        if compensation not in alg.LOCAL_SHARE:
            raise ValueError("compensation must be one of "
                             f"{', '.join(map(repr, alg.LOCAL_SHARE))}, got {compensation!r}")
        self.compensation = compensation

    def _prepare(self, entries):
        for e in entries:
            memory = self.memory_like(e.key, e.work)
            e.scratch = (alg.compensate(e.work, memory), memory is not None)
        return [[alg.l1_scale(e.scratch[0])] for e in entries]

    def _reduce(self, entries, scalars):
        ctx = self._context()
        with self._phase("encode"):
            packed = np.concatenate([np.ascontiguousarray(xp.to_host(alg.encode(e.scratch[0])))
                                     for e in entries])
        with self._phase("comm"):
            ring_allreduce(ctx, packed, alg.MarsitMerge(self.seed, self._step, ctx.rank,
                                                           self._keyed(())))
        out = []
        with self._phase("decode"):
            off = 0
            for i, e in enumerate(entries):
                p, p_is_scratch = e.scratch
                nbytes = packed_nbytes(e.numel)
                signs = alg.decode(xp.from_host(packed[off:off + nbytes], p), e.numel)
                delta = alg.global_scale(scalars[:, i, 0])
                share = alg.LOCAL_SHARE[self.compensation]
                local = (alg.own_message(p, share * scalars[ctx.rank, i, 0],
                                         out=self.scratch_like(e.key, p)) if share else None)
                step, memory = alg.apply(signs, delta, p, p_is_scratch, share, local)
                self._memory[e.key] = memory
                out.append(step)
                off += nbytes
        return out
