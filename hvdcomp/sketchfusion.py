"""``hvdcomp.SketchFusion``: Count-Sketch compression with worker-side error feedback (math in
``hvdcomp.algorithms.sketch``, the sketch in ``hvdcomp.backend.sketch``).

Per flush, all large gradients are compensated (``a = e + g``) and fused into one vector of n
elements (as Marsit does: one message for the whole step); k = ceil(ratio * n).

What travels, per rank and step (float32, plain ring all-reduces ``hvdcomp.comm.ring``):
- the r x c sketch: ``2 (size-1)/size * 4 r c`` bytes (sketches are linear: summed);
- with ``exact=True`` (default) the k exact values at the selected positions:
  ``2 (size-1)/size * 4 k`` bytes. No indices: every rank unsketches the same summed table and
  takes the same k positions.
With the defaults (ratio 0.01, rows 5, cols 10 k) that is ``51 k`` floats, i.e. about half of a
dense fp32 ring all-reduce's volume ``n``: pick a smaller ``width``/``cols`` or ``ratio`` for
more compression (the sketch's recovery of the heavy hitters degrades as c/k shrinks).

State per tensor: the error-feedback memory ``e`` (same kind/device as the working gradient).
Every rank applies the same update (bit-identical), from the same summed tables.
"""
import numbers

import numpy as np

from hvdcomp.algorithms import sketch as alg
from hvdcomp.backend import xp
from hvdcomp.backend.sketch import hashes
from hvdcomp.comm import ring_allreduce
from hvdcomp.compressor import BatchedCompressor, DEFAULT_MIN_COMPRESS_NUMEL


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class SketchFusion(BatchedCompressor):
    """Count-Sketch compression for ``hvd.DistributedOptimizer(..., compression=hvdcomp.SketchFusion)``.

    Args:
        ratio: k / n, in (0, 1]: how many positions of the fused step are applied. Default 0.01.
        rows: rows r of the sketch (independent hashes; the estimate is their median), >= 1.
        cols: columns c of the sketch; None (default) means ``width * k``. Must be >= k (checked
            when the step's n is known, on every rank alike).
        width: c / k when ``cols`` is None, >= 1 (a sketch narrower than k is refused). Default 10.
        exact: True (default): a second all-reduce sums the exact values at the k positions;
            False: apply the sketch's estimates (one round).
        seed: seed of the hashes (identical on every rank), >= 0.
        min_compress_numel, on_nonfinite, fusion, fusion_cost: as for every hvdcomp compressor.
        precondition: None (default), 'rms', or 'adam' / ``hvdcomp.AdamSettings(...)``: for
            Adam users, see ``BatchedCompressor`` and the README ("With Adam").
    Invalid settings raise ValueError here, at construction.
    """

    method = "SketchFusion"
    n_scalars = 0

    def __init__(self, ratio=0.01, *, rows=5, cols=None, width=10, exact=True, seed=0,
                 min_compress_numel=DEFAULT_MIN_COMPRESS_NUMEL, on_nonfinite="raise",
                 fusion=None, fusion_cost=None, precondition=None):
        if not (isinstance(ratio, numbers.Real) and not isinstance(ratio, bool)
                and 0.0 < float(ratio) <= 1.0):
            raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
        if not _is_int(rows) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        if cols is not None and (not _is_int(cols) or cols < 1):
            raise ValueError(f"cols must be None or an int >= 1, got {cols!r}")
        if not _is_int(width) or width < 1:
            raise ValueError(f"width (cols per selected position) must be an int >= 1, so that "
                             f"the sketch is not smaller than k; got {width!r}")
        if not isinstance(exact, bool):
            raise ValueError(f"exact must be True or False, got {exact!r}")
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        super().__init__(min_compress_numel=min_compress_numel, on_nonfinite=on_nonfinite,
                         seed=seed, fusion=fusion, fusion_cost=fusion_cost,
                         precondition=precondition)
        self.ratio, self.rows, self.cols, self.width = float(ratio), int(rows), cols, int(width)
        self.exact = exact

    def shape_for(self, n):
        """``(k, rows, cols)`` used for a fused step of ``n`` elements (ValueError if cols < k)."""
        k = alg.target_count(n, self.ratio)
        c = alg.sketch_cols(k, self.cols, self.width)
        if c < k:
            raise ValueError(f"{self.method}: the sketch has {c} columns but k = {k} positions "
                             f"are selected (n = {n}, ratio = {self.ratio}); raise cols")
        return k, self.rows, c

    def _prepare(self, entries):
        for e in entries:
            e.scratch = alg.accumulate(e.work, self.memory_like(e.key, e.work))
        return np.zeros((len(entries), 0))

    def _reduce(self, entries, scalars):
        ctx = self._context()
        with self._phase("encode"):
            fused = xp.to_host(xp.concat([e.scratch for e in entries], like=entries[0].scratch))
            k, rows, cols = self.shape_for(fused.shape[0])
            h = hashes(fused.shape[0], rows, cols, self.seed)
            table = alg.encode(fused, h)
        with self._phase("comm"):
            ring_allreduce(ctx, table)
        with self._phase("decode"):
            idx, sums = alg.select(table, h, k)
        if self.exact:
            with self._phase("comm"):
                sums = ring_allreduce(ctx, np.ascontiguousarray(fused[idx], dtype=np.float32))
        out = []
        with self._phase("decode"):
            applied, memory = alg.apply(fused, idx, sums, ctx.size, self.exact)
            off = 0
            for e in entries:
                self._memory[e.key] = xp.from_host(memory[off:off + e.numel], e.work)
                out.append(xp.from_host(applied[off:off + e.numel], e.work))
                off += e.numel
        return out
