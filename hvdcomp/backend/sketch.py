"""Count-Sketch of 1-D float vectors (NumPy; CPU torch tensors via ``.numpy()``).

A sketch of a vector ``x`` of length n is an ``r x c`` float32 table. Row j has a bucket hash
``h_j: [0, n) -> [0, c)`` and a sign hash ``s_j: [0, n) -> {-1, +1}``, and
``table[j, b] = sum over i with h_j(i) = b of s_j(i) * x[i]``.

- Hashes (``CountSketchHashes``) are drawn from ``numpy.random.default_rng([seed, j, n, c])``,
  one stream per row, so they depend only on (seed, n, c, row) and are identical on every rank
  (and row j is the same whatever r is). They are cached per (seed, n, r, c), least recently
  used evicted first once the cache holds more than ``CACHE_BYTES`` (the newest always stays),
  so per-bucket compression with many bucket sizes does not redraw hashes every step.
- Memory of the cached hashes: 5 bytes per element per row (int32 bucket + int8 sign), e.g.
  r = 5 rows over n = 25M elements: 625 MB; over 1M: 25 MB. Unsketching works in blocks of
  ``BLOCK`` elements, so its temporaries are ``r * BLOCK * 4`` bytes beyond the n-element
  float32 estimate; sketching needs one n-element float64 temporary per row.
- Linear: ``sketch(x + y) == sketch(x) + sketch(y)`` (exactly for integer-valued inputs whose
  bucket sums are exact in float32), so sketches of several ranks are merged by summing tables
  (``merge``), e.g. with a float ring all-reduce.
- ``unsketch(table)``: the estimate of every x[i], ``median over rows of s_j(i) *
  table[j, h_j(i)]``; ``heavy_hitters(table, k)``: the k positions of largest estimated
  magnitude (ascending int64) and their estimates. Both are deterministic functions of the
  table, so ranks holding the same table get bit-identical results.
Indices are int32 (so n < 2**31 and r * c < 2**31).
"""
import numpy as np

from hvdcomp.backend.topk import topk_exact

CACHE_BYTES = 1 << 30
BLOCK = 1 << 20
_cache = {}


class CountSketchHashes:
    """Bucket and sign hashes of an r x c Count-Sketch over n positions.

    Attributes:
        n, rows, cols, seed: the shape and seed.
        buckets: int32 array (rows, n), values in [0, cols).
        signs: int8 array (rows, n), values -1 or +1.
    """

    def __init__(self, n, rows, cols, seed=0):
        n, rows, cols, seed = int(n), int(rows), int(cols), int(seed)
        if n < 0 or rows < 1 or cols < 1 or seed < 0:
            raise ValueError(f"Count-Sketch needs n >= 0, rows >= 1, cols >= 1, seed >= 0; got "
                             f"n={n}, rows={rows}, cols={cols}, seed={seed}")
        if n >= 2 ** 31 or rows * cols >= 2 ** 31:
            raise ValueError(f"Count-Sketch indices are int32: n={n}, rows*cols={rows * cols}")
        self.n, self.rows, self.cols, self.seed = n, rows, cols, seed
        self.buckets = np.empty((rows, n), dtype=np.int32)
        self.signs = np.empty((rows, n), dtype=np.int8)
        for j in range(rows):
            rng = np.random.default_rng([seed, j, n, cols])
            self.buckets[j] = rng.integers(0, cols, size=n, dtype=np.int32)
            self.signs[j] = rng.integers(0, 2, size=n, dtype=np.int8) * 2 - 1

    @property
    def nbytes(self):
        return self.buckets.nbytes + self.signs.nbytes


def hashes(n, rows, cols, seed=0):
    """The (cached) ``CountSketchHashes`` for (seed, n, rows, cols)."""
    key = (int(seed), int(n), int(rows), int(cols))
    h = _cache.pop(key, None)
    if h is None:
        h = CountSketchHashes(n, rows, cols, seed)
    _cache[key] = h  # most recently used last
    while len(_cache) > 1 and sum(v.nbytes for v in _cache.values()) > CACHE_BYTES:
        _cache.pop(next(iter(_cache)))
    return h


def _host(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def sketch(x, h):
    """The r x c float32 table of the 1-D vector ``x`` (length ``h.n``) under hashes ``h``.
    Each row is one ``np.bincount`` (summed in float64, rounded once to float32)."""
    x = _host(x)
    if x.ndim != 1 or x.shape[0] != h.n:
        raise ValueError(f"sketch of shape {x.shape} with hashes for n={h.n}")
    table = np.empty((h.rows, h.cols), dtype=np.float32)
    for j in range(h.rows):
        table[j] = np.bincount(h.buckets[j], weights=h.signs[j] * x.astype(np.float64, copy=False),
                               minlength=h.cols)
    return table


def merge(*tables):
    """The sketch of the sum of the sketched vectors: the tables' sum, left to right."""
    out = np.array(tables[0], dtype=np.float32, copy=True)
    for t in tables[1:]:
        out += t
    return out


def unsketch(table, h, index=None):
    """Estimates (float32) of the sketched vector at ``index`` (int array) or at every position:
    the median over rows of ``sign * table[row, bucket]``."""
    table = np.asarray(table, dtype=np.float32).reshape(h.rows, h.cols)
    if index is not None:
        index = np.asarray(index, dtype=np.int64)
        est = table[np.arange(h.rows)[:, None], h.buckets[:, index]] * h.signs[:, index]
        return median_rows(est).astype(np.float32)
    out = np.empty(h.n, dtype=np.float32)
    est = np.empty((h.rows, min(h.n, BLOCK)), dtype=np.float32)
    for lo in range(0, h.n, BLOCK):
        hi = min(h.n, lo + BLOCK)
        blk = est[:, :hi - lo]
        for j in range(h.rows):  # one 1-D take per row: ~2x faster than a 2-D fancy index
            np.take(table[j], h.buckets[j, lo:hi], out=blk[j])
            blk[j] *= h.signs[j, lo:hi]
        out[lo:hi] = median_rows(blk)
    return out


NETWORK_MAX_ROWS = 9


def median_rows(est):
    """The median over axis 0 of an (r, m) float array, like ``np.median(est, axis=0)`` (for
    even r the mean of the two middle values). For r <= NETWORK_MAX_ROWS it sorts the rows in
    place with an odd-even transposition network of element-wise min/max (r(r-1)/2
    compare-exchanges of whole rows: ~15x faster than ``np.median`` for r = 5); ``est`` is
    overwritten."""
    r = est.shape[0]
    if r > NETWORK_MAX_ROWS:
        return np.median(est, axis=0)
    tmp = np.empty_like(est[0])
    for rnd in range(r):
        for i in range(rnd % 2, r - 1, 2):
            np.minimum(est[i], est[i + 1], out=tmp)
            np.maximum(est[i], est[i + 1], out=est[i + 1])
            est[i] = tmp
    if r % 2:
        return est[r // 2].copy()
    return (est[r // 2 - 1] + est[r // 2]) / 2


def heavy_hitters(table, h, k):
    """``(indices, estimates)``: the k positions (ascending int64) of largest estimated
    magnitude, and their estimates (float32). 1 <= k <= n."""
    return topk_exact(unsketch(table, h), k)
