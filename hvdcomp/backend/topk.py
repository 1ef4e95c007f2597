"""Top-k selection by magnitude for 1-D NumPy arrays and Torch tensors (any device).

Two selectors with the same contract: given a 1-D float array ``x`` (length n) and ``1 <= k <= n``
they return ``(indices, values)``: ``indices`` an int64 array, strictly ascending, of the same
kind and device as ``x``; ``values = x[indices]``.

- ``topk_exact(x, k)``: exactly k indices of largest ``|x|`` (``np.argpartition`` /
  ``torch.topk``, over the elements above a sampled threshold when that is safe and cheaper).
  Which of several equal magnitudes at the cut is chosen is left to the library (deterministic
  for a given input).
- ``topk_approx(x, k, seed=..., tol=0.5)``: threshold selection. It estimates the magnitude
  threshold for density k/n from a random sample of the elements (0.2% by default, at least enough
  that about 64 sampled elements lie above the threshold), then selects with one comparison over
  ``x``. Guarantee: the number c of returned indices always satisfies ``|c - k| <= tol * k``
  (default: within +-50% of k), and every returned magnitude is >= every magnitude left out.
  How: if the first threshold gives too many elements, the exact top-k of those candidates is
  taken (cheap, they are few); if too few, the threshold is re-estimated from the same sample with
  the rank scaled by the observed shortfall; if that still misses, the exact selector runs on the
  whole of ``x``. On data without large ties the first pass lands within about +-10% of k. The
  sample is drawn from ``numpy.random.default_rng(seed)``, so the result depends only on
  (x, k, seed, sample, tol), and NumPy and Torch inputs give the same indices (up to which of
  several equal magnitudes at the cut a trim or the exact fallback keeps).

Nothing here knows about ranks or frameworks beyond the array kind.
"""
import math

import numpy as np

from hvdcomp.backend.xp import _torch, is_torch

# CPU torch tensors of these dtypes are processed by NumPy through a zero-copy view (measured
# faster here: np.argpartition beats torch.topk, and the threshold pass is ~3x quicker). Set
# to False to run the Torch kernels, which also serve tensors on other devices.
CPU_VIA_NUMPY = True
EXACT_BELOW = 1 << 16  # below this many elements the exact selector is as cheap as sampling
MIN_SAMPLED_ABOVE = 64  # sample size floor: about this many sampled elements above the threshold


def _check(x, k):
    """``(n, k)`` for a 1-D ``x`` (an array or a ``Source``) and ``1 <= k <= n``; else
    ValueError."""
    n = int(x.shape[0]) if len(x.shape) == 1 else -1
    if n < 0:
        raise ValueError(f"top-k selection needs a 1-D array, got shape {tuple(x.shape)}")
    k = int(k)
    if not 1 <= k <= n:
        raise ValueError(f"top-k selection needs 1 <= k <= n, got k={k}, n={n}")
    return n, k


def _via_numpy(fn):
    """Decorator: run ``fn`` on a NumPy view of a CPU float32/float64 torch tensor and give the
    arrays it returns back as tensors (zero-copy both ways)."""
    def wrapper(x, k, **kw):
        if CPU_VIA_NUMPY and is_torch(x) and x.device.type == "cpu" and \
                str(x.dtype) in ("torch.float32", "torch.float64"):
            torch = _torch()
            return tuple(torch.from_numpy(a) for a in fn(x.detach().numpy(), k, **kw))
        return fn(x, k, **kw)
    wrapper.__doc__, wrapper.__name__ = fn.__doc__, fn.__name__
    return wrapper


def _magnitude(x):
    return x.abs() if is_torch(x) else np.abs(x)


def _sorted_pick(x, idx):
    """(ascending idx, x[idx]) for an int64 index array of x's kind."""
    idx = idx.sort().values if is_torch(idx) else np.sort(idx)
    return idx, x[idx]


def _exact_indices(mag, k):
    """Indices (unsorted, int64) of the k largest entries of ``mag``."""
    n = mag.shape[0]
    if k == n:
        return _torch().arange(n, device=mag.device) if is_torch(mag) else np.arange(n)
    if is_torch(mag):
        return _torch().topk(mag, k, sorted=False).indices
    return np.argpartition(mag, n - k)[n - k:].astype(np.int64, copy=False)


def _exact_among(x, idx, k):
    """(ascending indices, values) of the k largest magnitudes among the candidates ``idx``
    (ascending, as ``Source.above`` gives them)."""
    chosen = _exact_indices(_magnitude(x[idx]), k)
    if is_torch(x):
        return _sorted_pick(x, idx[chosen])
    keep = np.zeros(idx.shape[0], dtype=bool)  # a mask keeps idx's order: no sort needed
    keep[chosen] = True
    picked = idx[keep]
    return picked, x[picked]


def _sampled_magnitudes(x, m, seed):
    """``|x|`` at m positions drawn (with replacement) from ``numpy.random.default_rng(seed)``."""
    pos = np.random.default_rng(seed).integers(0, x.shape[0], size=m)
    if is_torch(x):
        pos = _torch().from_numpy(pos).to(x.device)
    return _magnitude(x[pos])


class Source:
    """What a selector reads of the vector x it selects from: ``shape``; ``sampled(m, seed)``: |x|
    at m positions drawn with replacement from ``numpy.random.default_rng(seed)``;
    ``above(threshold)``: ascending int64 indices where ``|x| >= threshold``; ``array()``: x
    itself. This one reads a given x (NumPy or Torch); ``hvdcomp.kernels.topk.SumSource``
    forms x = g + e during its first ``above`` scan (one pass instead of two)."""

    def __init__(self, x):
        self.x, self.shape = x, x.shape

    def sampled(self, m, seed):
        return _sampled_magnitudes(self.x, m, seed)

    def above(self, threshold):
        return _above(self.x, threshold)

    def array(self):
        return self.x


def _source(x):
    return x if isinstance(x, Source) else Source(x)


@_via_numpy
def topk_exact(x, k):
    """Exactly the k largest-magnitude elements: ``(ascending int64 indices, values)``. For
    large x and k <= n/8, the candidates are first cut down with one threshold pass (a sampled
    threshold aimed at about 1.5k elements, below the k-th largest magnitude whenever at least k
    elements pass it, so the top-k is among them), then selected exactly; if fewer than k pass,
    the whole of x is selected from. ``x`` may be a ``Source``."""
    src = _source(x)
    n, k = _check(src, k)
    if n >= EXACT_BELOW and 8 * k <= n:
        m = min(n // 2, max(int(0.002 * n), math.ceil(4 * MIN_SAMPLED_ABOVE * n / k)))
        r = min(m, math.ceil(1.5 * m * k / n))
        idx = src.above(_kth_largest(src.sampled(m, 0), r))
        if idx.shape[0] >= k:
            return _exact_among(src.array(), idx, k)
    x = src.array()
    return _sorted_pick(x, _exact_indices(_magnitude(x), k))


def _kth_largest(sample, r):
    """The r-th largest value (r >= 1) of a 1-D sample, as a Python float."""
    m = sample.shape[0]
    if is_torch(sample):
        return float(_torch().kthvalue(sample, m - r + 1).values)
    return float(np.partition(sample, m - r)[m - r])


SCAN_BLOCK = 1 << 18  # elements per block of the NumPy threshold scan (best of 2**14..2**20 here)


def _above(x, threshold):
    """Ascending int64 indices where ``|x| >= threshold``. NumPy scans in blocks of SCAN_BLOCK
    elements (|x|, the comparison and the index extraction never make an n-sized temporary)."""
    if is_torch(x):
        return (x.abs() >= threshold).nonzero().reshape(-1)
    n = x.shape[0]
    mag = np.empty(min(n, SCAN_BLOCK), dtype=x.dtype)
    hit = np.empty(mag.shape[0], dtype=bool)
    found = []
    for lo in range(0, n, SCAN_BLOCK):
        m = min(SCAN_BLOCK, n - lo)
        np.abs(x[lo:lo + m], out=mag[:m])
        np.greater_equal(mag[:m], threshold, out=hit[:m])
        idx = np.flatnonzero(hit[:m])
        if idx.size:
            found.append(idx + lo)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


@_via_numpy
def topk_approx(x, k, *, seed=0, sample=0.002, tol=0.5, info=None):
    """Approximately the k largest-magnitude elements, ``|count - k| <= tol * k`` guaranteed.

    Args:
        x: 1-D float NumPy array or Torch tensor (length n), or a ``Source``.
        k: target count, 1 <= k <= n.
        seed: seed of the sample positions (int).
        sample: fraction of the elements sampled (before the floor described in the module doc).
        tol: allowed relative deviation of the count from k, in [0, 1).
        info: optional dict, filled with ``pass`` ('sample', 'sample-trim', 'resample',
            'resample-trim', or 'exact') and ``count``.
    Returns:
        ``(indices, values)`` as described in the module docstring.
    """
    src = _source(x)
    n, k = _check(src, k)
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"tol must lie in [0, 1), got {tol}")
    info = {} if info is None else info
    m = min(n, max(int(sample * n), math.ceil(MIN_SAMPLED_ABOVE * n / k)))
    if n < EXACT_BELOW or k == n or 2 * m >= n:
        info.update({"pass": "exact", "count": k})
        return topk_exact(src.array(), k)
    sampled = src.sampled(m, seed)
    r = max(1, round(m * k / n))  # sample rank of the threshold for density k/n
    lo, hi = k - tol * k, k + tol * k
    for attempt in ("sample", "resample"):
        idx = src.above(_kth_largest(sampled, r))
        c = int(idx.shape[0])
        if lo <= c <= hi:
            info.update({"pass": attempt, "count": c})
            return idx, src.array()[idx]
        if c > hi:  # too many: the exact top-k among the (few) candidates
            info.update({"pass": attempt + "-trim", "count": k})
            return _exact_among(src.array(), idx, k)
        # too few: the sample overestimated the threshold; scale its rank by the shortfall
        r = min(m, math.ceil(r * k / max(c, 1) * 1.1))
    info.update({"pass": "exact", "count": k})
    x = src.array()
    return _sorted_pick(x, _exact_indices(_magnitude(x), k))


def select_topk(x, k, method="approx", seed=0):
    """``topk_approx`` (method 'approx') or ``topk_exact`` (method 'exact')."""
    if method == "exact":
        return topk_exact(x, k)
    if method == "approx":
        return topk_approx(x, k, seed=seed)
    raise ValueError(f"selection method must be 'approx' or 'exact', got {method!r}")
