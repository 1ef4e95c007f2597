"""``hvdcomp.SketchFusion``: Count-Sketch compression with worker-side error feedback (math in
``hvdcomp.methods.sketchfusion.math``, the sketch in ``hvdcomp.methods.sketchfusion.sketch``).

Per flush, all large gradients are compensated (``a = e + g``) and fused into one vector of n
elements (as Marsit does: one message for the whole step); k = ceil(ratio * n).

What travels, per rank and step (plain ring all-reduces ``hvdcomp.comm.ring``: its messages are
large, where MPI's own all-reduce was 1.4-1.5x slower at 300 Mbit/s on 4 hosts, 2026-11-28, see
``hvdcomp.comm.ring``), as float16 (``wire``, default; ``hvdcomp.comm.float16_allreduce``) or
float32, ``b`` bytes per value:
- the r x c sketch: ``2 (size-1)/size * b r c`` bytes (sketches are linear: summed);
- with ``exact=True`` (default) the k exact values at the selected positions:
  ``2 (size-1)/size * b k`` bytes. No indices: every rank unsketches the same summed table and
  takes the same k positions.
With the defaults (ratio 0.05, rows 1, cols 2 k, float16) that is ``3 k`` halves, i.e. 0.075 of
a dense fp32 ring all-reduce's volume ``n`` (12x fewer bytes on the digits MLP; 2.4 bits per
element). Over a float16 wire each rank keeps its own rounding of the exact values in its memory;
the sketch's rounding only moves which positions are picked.

How the defaults were chosen, by time to accuracy (benchmarks/convergence.py --tasks recipes, 3
seeds, every step compressed): the first default, ratio 0.01 with 3 x 2k float32 (1/14 of fp32's
bytes), missed the uncompressed accuracy by 8.8 pp on a plain-SGD MLP after the same epochs (it
needed about 4x the epochs) and by 3.3 pp on a CNN with momentum and a cosine schedule, 0.02 by
2 pp: density is what the sparse step needs. 0.05 with 3 x 2k float32 (7k floats, 0.35 of fp32)
was within 0.3 pp on both. The density kept, the bytes cut (2026-11-29): 3 x 2k float16 -0.19
/ +0.46 pp (0.18 of fp32), 3 x k float16 -0.46 / -0.28 (0.11), 1 x 2k float16 -0.28 / +0.09
(0.08; the default), against float32's 3 x 2k -0.09 / +0.09 in the same job. A sketch of 3 x 2k
is too narrow to recover the heavy hitters precisely anyway: the k positions it picks are noisy,
the exact second round sends their true sums, and error feedback keeps what it missed; one row
picks whole buckets (about ``1 / (width ratio)`` positions share each), and the same holds.

Under the user's Adam/AdamW (its momentum sent, see ``hvdcomp.preconditioning.FollowAdam``) a
step sends ``momentum_ratio`` (default 0.2) of the fused momentum through a one-row sketch as
wide as k (``k`` columns), i.e. ``2 k`` values: halves by default, 0.2 of fp32's bytes (0.4
with ``wire="float32"``). Why: Adam moves every
coordinate by about its learning rate at every step, so a coordinate left out of the step loses
its move, not only its delay (as for TopK's ``momentum_ratio``): density matters more than the
precision of the selection, which the exact second round and the error feedback make up for.
Char transformer under AdamW (recipe (c), seed 0): the gradient's geometry (5%, 3 x 2k, 0.35 of
fp32) +7.3%, 10% with 1 x 2k (0.3) +2.9%, 20% with 1 x k (0.4) +0.5%.

State per tensor: the error-feedback memory ``e`` (same kind/device as the working gradient).
Every rank applies the same update (bit-identical), from the same summed tables.
"""
import numpy as np

from hvdcomp import feedback, kernels, preconditioning, validate
from hvdcomp.methods.sketchfusion import math as alg
from hvdcomp.backend import xp
from hvdcomp.methods.sketchfusion.sketch import hashes
from hvdcomp.backend.topk import topk_exact
from hvdcomp.comm import float16_allreduce, ring_allreduce
from hvdcomp.methods.contract import Method

KERNELS = "hvdcomp.methods.sketchfusion.kernels"  # its fused kernels (hvdcomp.kernels.warm)


def sketch_of(fused, h):
    """``alg.encode(fused, h)``: this rank's table, flattened; for a host float32 vector by the
    one-pass kernel (``hvdcomp.methods.sketchfusion.kernels``, the same bits) when the kernels are on."""
    if kernels.active(KERNELS, fused) and fused.dtype == np.float32:
        from hvdcomp.methods.sketchfusion import kernels as ks
        table = np.zeros((h.rows, h.cols), dtype=np.float32)
        ks.sketch(fused, h.offsets, h.chunk_signs, table)
        return table.reshape(-1)
    return alg.encode(fused, h)


def heavy_hitters(table, h, k, device=None, scratch=None):
    """``alg.select(table, h, k, device)``; on the host (``device`` None), the estimates come from
    the fused kernel (``hvdcomp.methods.sketchfusion.kernels``, the same numbers) when it serves (numba, at
    most ``MAX_ROWS`` rows), into ``scratch`` (a host float32 buffer of ``h.n`` elements kept
    across steps, or None: a new one), and the exact top-k's threshold scan is the kernels'
    (``hvdcomp.kernels.topk``)."""
    if device is None and kernels.on(KERNELS):
        from hvdcomp.methods.sketchfusion import kernels as ks
        from hvdcomp.kernels.topk import SumSource
        if h.rows <= ks.MAX_ROWS:
            est = np.empty(h.n, dtype=np.float32) if scratch is None else scratch
            ks.unsketch(np.ascontiguousarray(table, dtype=np.float32).reshape(h.rows, h.cols),
                        h.offsets, h.chunk_signs, h.n, est)
            return topk_exact(SumSource(est, None, None, capacity=2 * k + 64), k)
    return alg.select(table, h, k, device)


ESTIMATES = "#estimates"  # the store's scratch key of the step's unsketched estimates


class SketchFusion(Method):
    """Count-Sketch compression for ``hvd.DistributedOptimizer(..., compression=hvdcomp.SketchFusion)``.

    Args:
        ratio: k / n, in (0, 1]: how many positions of the fused step are applied. Default 0.05
            (chosen by time to accuracy: see the module docstring).
        momentum_ratio: k / n where the user's Adam/AdamW momentum is sent, with a sketch of one
            row of k columns (``rows``, ``cols``, ``width`` then unused). Default 0.2 (see the
            module docstring).
        rows: rows r of the sketch (independent hashes; the estimate is their median), >= 1.
            Default 1 (see the module docstring).
        cols: columns c of the sketch; None (default) means ``width * k``. Must be >= k (checked
            when the step's n is known, on every rank alike).
        width: c / k when ``cols`` is None, >= 1 (a sketch narrower than k is refused). Default 2.
        exact: True (default): a second all-reduce sums the exact values at the k positions;
            False: apply the sketch's estimates (one round).
        wire: "float16" (default): the summed table and the exact values travel as float16
            (``hvdcomp.comm.float16_allreduce``: half the bytes; each rank's own rounding of
            its exact values stays in its memory; where a sum overflows float16, every rank
            sums that buffer again in float32); "float32": the wire before 2026-11-29.
        seed: seed of the hashes (identical on every rank), >= 0.
        min_compress_numel, on_nonfinite, fusion, fusion_cost, precondition: as for every
            hvdcomp compressor (``hvdcomp.facade.BatchedCompressor``).
    Invalid settings raise ValueError here, at construction.
    """

    name = "SketchFusion"
    n_scalars = 0
    kernel_modules = (KERNELS, "topk")  # its table, and the exact top-k's threshold scan

    def __init__(self, ratio=0.05, *, momentum_ratio=0.2, rows=1, cols=None, width=2,
                 exact=True, wire="float16"):
        self.ratio = validate.fraction("ratio", ratio)
        self.momentum_ratio = validate.fraction("momentum_ratio", momentum_ratio)
        self.rows = validate.count("rows", rows, 1)
        self.cols = validate.optional_count("cols", cols, 1)
        self.width = validate.count("width (cols per selected position)", width, 1)
        self.exact = validate.flag("exact", exact)
        self.wire = validate.choice("wire", wire, ("float16", "float32"))

    def settings(self):
        return {"ratio": self.ratio, "momentum_ratio": self.momentum_ratio, "rows": self.rows,
                "cols": self.cols, "width": self.width, "exact": self.exact, "wire": self.wire}

    def shape_for(self, n, momentum=False):
        """``(k, rows, cols)`` used for a fused step of ``n`` elements (ValueError if cols < k);
        ``momentum``: the step sends the user's Adam momentum (``momentum_ratio``, one row of k
        columns: see the module docstring)."""
        if momentum:
            k = alg.target_count(n, self.momentum_ratio)
            return k, 1, k
        k = alg.target_count(n, self.ratio)
        c = alg.sketch_cols(k, self.cols, self.width)
        if c < k:
            raise ValueError(f"{self.name}: the sketch has {c} columns but k = {k} positions "
                             f"are selected (n = {n}, ratio = {self.ratio}); raise cols")
        return k, self.rows, c

    def _summed(self, ctx, buf):
        """``(sums, sent)`` of the host float32 ``buf`` over ``ctx``'s ranks on this method's
        ``wire`` (``hvdcomp.comm.float16_allreduce``, or the float32 ring: ``sent`` None, i.e.
        ``buf`` itself went)."""
        if self.wire == "float16":
            return float16_allreduce(ctx, buf)
        return ring_allreduce(ctx, buf), None

    def prepare(self, batch):
        for e in batch.entries:
            feedback.compensate(batch, e)
        return np.zeros((len(batch.entries), 0))

    def reduce(self, batch, scalars):
        ctx, entries = batch.ctx, batch.entries
        first = entries[0].compensated
        device = first.device if xp.is_torch(first) else None  # a device tensor's stays there
        with batch.phase("encode"):
            # owned buffers (steady state: the memory's spares, slices of an earlier step's
            # fused vector) are joined without a copy when they already lie end to end
            parts = [e.compensated for e in entries]
            fused = (xp.joined(parts, like=first) if all(e.owned for e in entries)
                     else xp.concat(parts, like=first))
            k, rows, cols = self.shape_for(fused.shape[0], any(
                preconditioning.sends_momentum(self.preconditioner, e) for e in entries))
            h = hashes(fused.shape[0], rows, cols, self.seed)
            table = xp.to_host(sketch_of(fused, h))
        with batch.phase("comm"):
            table = self._summed(ctx, table)[0]
        with batch.phase("decode"):
            scratch = (None if device is not None else
                       batch.store.scratch_bytes(ESTIMATES, 4 * h.n).view(np.float32))
            idx, sums = heavy_hitters(table, h, k, device, scratch)
        sent = None
        if self.exact:
            with batch.phase("comm"):
                sums, sent = self._summed(ctx, np.ascontiguousarray(xp.to_host(fused[idx]),
                                                                    dtype=np.float32))
        out, off = [], 0
        with batch.phase("decode"):
            # the fused vector is a new array (several tensors) or an owned buffer: the memory
            # is written into it; only a lone unowned gradient (a first step) is copied
            owned = len(entries) > 1 or entries[0].owned
            values = alg.step_values(sums, ctx.size, fused)
            memory = alg.residual(fused, idx, values, self.exact, copy=not owned, sent=sent)
            # each tensor's step is spread into its own buffer (the user's gradient where
            # allowed: nothing reads the gradients any more), from its run of the sorted idx
            cuts = xp.searchsorted(idx, np.cumsum([0] + [e.numel for e in entries]))
            for t, e in enumerate(entries):
                feedback.keep(batch, e, xp.from_host(memory[off:off + e.numel], e.work))
                run = slice(cuts[t], cuts[t + 1])
                out.append(xp.spread(values[run], idx[run] - off,
                                     e.result_buffer(e.work, done_reading=True)))
                off += e.numel
        return out
