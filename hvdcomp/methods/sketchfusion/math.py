"""Sketch-Fusion: Count-Sketch compression with worker-side error feedback: the math, no MPI.

Per step, on every rank i, for the step's fused gradient vector g (length n, float32):

1. ``a = e + g``                       (e: this rank's memory, zero at first)
2. ``S_i = sketch(a)``                 (r x c float32 table, hashes shared by all ranks)
3. ``S = sum_i S_i``                   (linear: the sketch of ``sum_i a_i``; a float ring
                                        all-reduce of r*c values)
4. ``G = heavy_hitters(S, k)``         (every rank unsketches the same S: the same k positions)
5. values: with ``exact=True`` the exact sums ``sum_i a_i[G]`` (a second ring all-reduce of a
   k-vector; no indices travel, every rank knows G); with ``exact=False`` the sketch's
   estimates ``unsketch(S)[G]``. Steps 3 and 5 may travel as float16 (``wire``): then the
   sums are of each rank's values rounded to float16, each hop's partial sum rounded once.
6. every rank applies ``values / size`` at G and 0 elsewhere.
7. memory: ``exact=True``: ``e = a`` with zeros at G (this rank contributed exactly ``a_i[G]``
   to the applied sum, so that mass leaves its memory; over a float16 wire, ``a_i[G]`` less
   what it sent, its own rounding, stays); ``exact=False``: ``e = a - applied``
   at G (each rank gives up an equal share of the estimate). Either way
   ``sum_i e_i + size * applied == sum_i a_i`` (mass is conserved up to rounding: float32's, or
   over a float16 wire, that of the float16 partial sums).

Why worker-side error feedback rather than FetchSGD's sketch-space momentum/error (S_u, S_e
kept on the summed table, identical on every rank): the memory is exact (no sketch collision
noise accumulates in it, and nothing is lost when a heavy hitter is mis-estimated), the state is
per rank like Marsit's and TopK's (per-rank checkpoints), and it works with any optimizer's own
momentum. The cost is n floats of memory per rank (FetchSGD's: 2 r c, replicated), and, as in
any worker-side scheme, the second round when exact values are wanted.

The gradients are the raw gradients; the learning rate and momentum are the user optimizer's.
"""
import math

import numpy as np

from hvdcomp.methods.sketchfusion import sketch as cs
from hvdcomp.backend import xp
from hvdcomp.backend.xp import _torch, is_torch


def target_count(n, ratio):
    """k = ceil(ratio * n), clipped to [1, n] (0 for n = 0)."""
    return min(int(n), max(1, math.ceil(ratio * n))) if n else 0


def sketch_cols(k, cols=None, width=10):
    """Columns of the table: ``cols`` when given, else ``width * k``."""
    return int(cols) if cols is not None else int(width) * int(k)


def accumulate(grad, memory):
    """``a = grad + memory`` (``memory`` None means zero); same kind/device as ``grad``."""
    return grad if memory is None else grad + memory


def encode(a, h):
    """This rank's message: the float32 r x c sketch of ``a`` (NumPy or a device tensor, 1-D),
    flattened, contiguous, of ``a``'s kind."""
    return cs.sketch(a, h).reshape(-1)


def select(table, h, k, device=None):
    """``(indices, estimates)`` of the k heavy hitters of the summed table (host float32):
    ascending int64, NumPy, or tensors on ``device`` when that is a device."""
    return cs.heavy_hitters(table, h, k, device)


def step_values(sums, size, like):
    """The step at the selected positions: ``sums / size`` (exact sums or estimates, host or
    ``like``'s kind) as float32 of ``like``'s kind and device."""
    if is_torch(like):
        torch = _torch()
        return torch.as_tensor(sums, device=like.device).to(torch.float32) / size
    return np.asarray(sums, dtype=np.float32) / np.float32(size)


def residual(a, indices, values, exact=True, copy=True, sent=None):
    """This rank's new memory from its ``a`` (float32), the selected ``indices`` and the step's
    ``values`` there: ``a`` less what this rank gave at them (``exact``: zeros where it sent its
    values as they were, ``sent`` None; else ``a - sent``, ``sent`` holding what it put on the
    wire, e.g. rounded to float16: host or ``a``'s kind) or less ``values`` (estimates).
    ``copy=False``: written into ``a`` itself (a buffer the caller owns)."""
    memory = (a.clone() if is_torch(a) else a.copy()) if copy else a
    if exact and sent is not None:
        memory[indices] -= xp.from_host(sent, a)
    elif exact:
        memory[indices] = 0
    else:
        memory[indices] -= values
    return memory


def apply(a, indices, sums, size, exact=True, copy=True):
    """``(applied, memory)`` (float32, length n, of ``a``'s kind and device) from this rank's
    ``a`` (float32), the selected ``indices`` (of ``a``'s kind) and the summed values there
    (exact sums or estimates; host or ``a``'s kind): ``step_values`` spread over ``a``'s length
    (``xp.spread``) and ``residual``."""
    values = step_values(sums, size, a)
    applied = xp.spread(values, indices, xp.empty_like(a))
    return applied, residual(a, indices, values, exact, copy)
