"""Count-Sketch of 1-D float vectors (NumPy; CPU torch tensors via ``.numpy()``; CUDA tensors
on their device).

A sketch of a vector ``x`` of length n is an ``r x c`` float32 table. Row j has a bucket hash
``h_j: [0, n) -> [0, c)`` and a sign hash ``s_j: [0, n) -> {-1, +1}``, and
``table[j, b] = sum over i with h_j(i) = b of s_j(i) * x[i]``.

- Hash family (offset hashing): position i lies in chunk ``q = i // c`` at offset
  ``p = i % c``; row j draws one random offset ``o[j, q]`` in [0, c) and one random sign
  ``sigma[j, q]`` per chunk, and ``h_j(i) = (p + o[j, q]) mod c``, ``s_j(i) = sigma[j, q]``.
  Two positions of one chunk never share a bucket; two positions of different chunks share one
  with probability exactly 1/c, with independent signs: the same collision probability, sign
  independence and estimate variance (``||x||^2 / c`` per row) as fully random hashes. What is
  gained: every chunk maps onto the table as at most two contiguous slices, so sketching and
  unsketching are slice additions and copies at memory speed, not scatter/gather by index, and
  the hashes are ``r * ceil(n / c)`` numbers instead of ``r * n``.
- Hashes (``CountSketchHashes``) are drawn from ``numpy.random.default_rng([seed, j, n, c])``,
  one stream per row, so they depend only on (seed, n, c, row) and are identical on every rank
  (and row j is the same whatever r is); ``hashes()`` caches the last ``CACHE_SIZE``.
- Linear: ``sketch(x + y) == sketch(x) + sketch(y)`` (exactly for integer-valued inputs whose
  bucket sums are exact in float32), so sketches of several ranks are merged by summing tables
  (``merge``), e.g. with a float ring all-reduce. Tables accumulate in float32, chunk by chunk in
  a fixed order, so every rank computes the same table from the same input bit for bit.
- ``unsketch(table)``: the estimate of every x[i], ``median over rows of s_j(i) *
  table[j, h_j(i)]``; ``heavy_hitters(table, k)``: the k positions of largest estimated
  magnitude (ascending int64) and their estimates. Both are deterministic functions of the
  table, so ranks holding the same table get bit-identical results. Unsketching works in blocks
  of ``BLOCK`` positions (``r * BLOCK * 4`` bytes of temporaries, sized to stay in cache).
- Device tensors (``sketch(x)`` of a CUDA ``x``, ``unsketch``/``heavy_hitters`` with
  ``device=``) run on the device, a block of chunks at a time (``DEVICE_BLOCK`` positions): a
  chunk's slice of the table is a gather of the chunk rotated by its offset. The device sums a
  bucket's chunks in its own (fixed) order, so its table can differ from the host's in the last
  bits; the same input gives the same table on every run and rank. The estimates are the
  host's for the same table (a median only selects).
"""
import numpy as np

from hvdcomp.backend.topk import topk_exact
from hvdcomp.backend.xp import _torch, is_torch

CACHE_SIZE = 8
BLOCK = 1 << 17
TABLE_BLOCK = 1 << 18
DEVICE_BLOCK = 1 << 22
_cache = {}


class CountSketchHashes:
    """Bucket and sign hashes of an r x c Count-Sketch over n positions (offset hashing, see the
    module docstring).

    Attributes:
        n, rows, cols, seed: the shape and seed.
        chunks: ``ceil(n / cols)``.
        offsets: int64 array (rows, chunks), values in [0, cols).
        chunk_signs: int8 array (rows, chunks), values -1 or +1.
    """

    def __init__(self, n, rows, cols, seed=0):
        n, rows, cols, seed = int(n), int(rows), int(cols), int(seed)
        if n < 0 or rows < 1 or cols < 1 or seed < 0:
            raise ValueError(f"Count-Sketch needs n >= 0, rows >= 1, cols >= 1, seed >= 0; got "
                             f"n={n}, rows={rows}, cols={cols}, seed={seed}")
        self.n, self.rows, self.cols, self.seed = n, rows, cols, seed
        self.chunks = -(-n // cols)
        self.offsets = np.empty((rows, self.chunks), dtype=np.int64)
        self.chunk_signs = np.empty((rows, self.chunks), dtype=np.int8)
        for j in range(rows):
            rng = np.random.default_rng([seed, j, n, cols])
            self.offsets[j] = rng.integers(0, cols, size=self.chunks)
            self.chunk_signs[j] = rng.integers(0, 2, size=self.chunks, dtype=np.int8) * 2 - 1

    def buckets(self, index):
        """``h_j(index)`` for every row: int64 array (rows, len(index))."""
        index = np.asarray(index, dtype=np.int64)
        q, p = np.divmod(index, self.cols)
        return (p + self.offsets[:, q]) % self.cols

    def signs(self, index):
        """``s_j(index)`` for every row: int8 array (rows, len(index))."""
        return self.chunk_signs[:, np.asarray(index, dtype=np.int64) // self.cols]

    def slices(self, row, lo, hi):
        """The positions [lo, hi) as runs ``(start, stop, bucket, sign)``: positions
        start..stop-1 map to buckets bucket..bucket+(stop-start)-1 of ``row``, with ``sign``."""
        c = self.cols
        i = lo
        while i < hi:
            q = i // c
            b = (i - q * c + int(self.offsets[row, q])) % c
            stop = min(hi, (q + 1) * c, i + (c - b))
            yield i, stop, b, int(self.chunk_signs[row, q])
            i = stop


def hashes(n, rows, cols, seed=0):
    """The (cached) ``CountSketchHashes`` for (seed, n, rows, cols)."""
    key = (int(seed), int(n), int(rows), int(cols))
    h = _cache.pop(key, None)
    if h is None:
        h = CountSketchHashes(n, rows, cols, seed)
    _cache[key] = h  # most recently used last
    while len(_cache) > CACHE_SIZE:
        _cache.pop(next(iter(_cache)))
    return h


def _host(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def sketch(x, h):
    """The r x c float32 table of the 1-D vector ``x`` (length ``h.n``) under hashes ``h``.

    Per row, every chunk of ``x`` is added to (or, for sign -1, subtracted from) the table as at
    most two contiguous slices. The table row is filled ``TABLE_BLOCK`` buckets at a time, taking
    from every chunk the slice that lands there, so the block being summed stays in cache while
    ``x`` streams past once per row. The additions into each bucket happen in chunk order, so
    the result does not depend on the blocking."""
    if is_torch(x) and not x.is_cpu and x.ndim == 1 and x.shape[0] == h.n:
        return _device_sketch(x, h)
    x = _host(x)
    if x.ndim != 1 or x.shape[0] != h.n:
        raise ValueError(f"sketch of shape {x.shape} with hashes for n={h.n}")
    x = x.astype(np.float32, copy=False)
    table = np.zeros((h.rows, h.cols), dtype=np.float32)
    for j in range(h.rows):
        row = table[j]
        runs = list(h.slices(j, 0, h.n))  # (lo, hi, bucket, sign), in chunk order
        for b0 in range(0, h.cols, TABLE_BLOCK):
            b1 = min(h.cols, b0 + TABLE_BLOCK)
            for lo, hi, b, sign in runs:
                s0, s1 = max(b, b0), min(b + hi - lo, b1)
                if s0 < s1:
                    dst = row[s0:s1]
                    src = x[lo + s0 - b:lo + s1 - b]
                    (np.add if sign > 0 else np.subtract)(dst, src, out=dst)
    return table


def merge(*tables):
    """The sketch of the sum of the sketched vectors: the tables' sum, left to right."""
    out = np.array(tables[0], dtype=np.float32, copy=True)
    for t in tables[1:]:
        out += t
    return out


def _device_chunks(h, device):
    """(offsets, signs, column numbers) of ``h`` on ``device``, for the device paths."""
    torch = _torch()
    return (torch.as_tensor(h.offsets, device=device),
            torch.as_tensor(h.chunk_signs, device=device).to(torch.float32),
            torch.arange(h.cols, device=device))


def _chunk_blocks(h):
    """``[q0, q1)`` ranges of chunks of about ``DEVICE_BLOCK`` positions, in order."""
    step = max(1, DEVICE_BLOCK // h.cols)
    return [(q0, min(h.chunks, q0 + step)) for q0 in range(0, h.chunks, step)]


def _device_sketch(x, h):
    """``sketch`` of a device tensor, on its device: bucket b of row j sums, over chunks q,
    ``sigma[j, q] * chunk_q[(b - o[j, q]) mod c]`` (zeros past n), block by block."""
    torch = _torch()
    c = h.cols
    x = x.to(torch.float32)
    padded = torch.nn.functional.pad(x, (0, h.chunks * c - h.n)).reshape(h.chunks, c)
    offsets, signs, cols = _device_chunks(h, x.device)
    table = torch.zeros(h.rows, c, dtype=torch.float32, device=x.device)
    for q0, q1 in _chunk_blocks(h):
        for j in range(h.rows):
            pos = (cols[None, :] - offsets[j, q0:q1, None]) % c
            table[j] += (padded[q0:q1].gather(1, pos) * signs[j, q0:q1, None]).sum(0)
    return table


def _device_unsketch(table, h, device):
    """``unsketch(table, h)`` at every position, on ``device`` (a float32 tensor)."""
    torch = _torch()
    c = h.cols
    table = torch.as_tensor(np.asarray(table, dtype=np.float32).reshape(h.rows, c),
                            device=device)
    offsets, signs, cols = _device_chunks(h, device)
    out = torch.empty(h.chunks * c, dtype=torch.float32, device=device)
    for q0, q1 in _chunk_blocks(h):
        est = torch.empty(h.rows, (q1 - q0) * c, dtype=torch.float32, device=device)
        for j in range(h.rows):
            buckets = (cols[None, :] + offsets[j, q0:q1, None]) % c
            est[j] = (table[j][buckets] * signs[j, q0:q1, None]).reshape(-1)
        out[q0 * c:q1 * c] = median_rows(est)
    return out[:h.n]


def unsketch(table, h, index=None, device=None):
    """Estimates (float32) of the sketched vector at ``index`` (int array) or at every position:
    the median over rows of ``sign * table[row, bucket]``. ``device`` (a torch device, not
    'cpu'; every position only): computed there, returned as a tensor there."""
    if device is not None and index is None and str(device) != "cpu":
        return _device_unsketch(table, h, device)
    table = np.asarray(table, dtype=np.float32).reshape(h.rows, h.cols)
    if index is not None:
        index = np.asarray(index, dtype=np.int64)
        est = table[np.arange(h.rows)[:, None], h.buckets(index)] * h.signs(index)
        return median_rows(est).astype(np.float32)
    out = np.empty(h.n, dtype=np.float32)
    est = np.empty((h.rows, min(h.n, BLOCK)), dtype=np.float32)
    for lo in range(0, h.n, BLOCK):
        hi = min(h.n, lo + BLOCK)
        blk = est[:, :hi - lo]
        for j in range(h.rows):
            for a, z, b, sign in h.slices(j, lo, hi):
                dst = blk[j, a - lo:z - lo]
                if sign > 0:
                    dst[...] = table[j, b:b + z - a]
                else:
                    np.negative(table[j, b:b + z - a], out=dst)
        out[lo:hi] = median_rows(blk)
    return out


NETWORK_MAX_ROWS = 9


def _ops(x):
    """(minimum, maximum, empty_like, copy) for ``x``'s kind (NumPy or torch)."""
    if is_torch(x):
        torch = _torch()
        return torch.minimum, torch.maximum, torch.empty_like, torch.clone
    return np.minimum, np.maximum, np.empty_like, np.copy


def _median3(x, y, z, t):
    """Element-wise median of three rows into ``x`` (``y`` and ``t`` are clobbered):
    ``max(min(x, y), min(max(x, y), z))``."""
    minimum, maximum, _, _ = _ops(x)
    minimum(x, y, out=t)
    maximum(x, y, out=x)
    minimum(x, z, out=x)
    maximum(x, t, out=x)
    return x


def median_rows(est):
    """The median over axis 0 of an (r, m) float array (NumPy, or a torch tensor on any device),
    like ``np.median(est, axis=0)`` (for even r the mean of the two middle values); ``est`` is
    overwritten. r = 3 and r = 5 use selection formulas (4 and 10 element-wise min/max passes;
    median of 5 is ``median3(e, max(min(a, b), min(c, d)), min(max(a, b), max(c, d)))``); other
    r <= NETWORK_MAX_ROWS sort the rows with an odd-even transposition network of whole-row
    compare-exchanges (r(r-1)/2 of them); larger r fall back to ``np.median`` (torch: a sort)."""
    minimum, maximum, empty_like, copy = _ops(est)
    r = est.shape[0]
    if r == 1:
        return copy(est[0])
    if r == 3:
        return copy(_median3(est[0], est[1], est[2], empty_like(est[0])))
    if r == 5:
        a, b, c, d, e = est
        t = empty_like(a)
        minimum(a, b, out=t)
        maximum(a, b, out=b)        # b = max(a, b)
        minimum(c, d, out=a)        # a = min(c, d)
        maximum(c, d, out=d)        # d = max(c, d)
        maximum(t, a, out=a)        # a = max(min(a, b), min(c, d))
        minimum(b, d, out=b)        # b = min(max(a, b), max(c, d))
        return copy(_median3(e, a, b, t))
    if r > NETWORK_MAX_ROWS:
        if not is_torch(est):
            return np.median(est, axis=0)
        est = est.sort(dim=0).values
    else:
        tmp = empty_like(est[0])
        for rnd in range(r):
            for i in range(rnd % 2, r - 1, 2):
                minimum(est[i], est[i + 1], out=tmp)
                maximum(est[i], est[i + 1], out=est[i + 1])
                est[i] = tmp
    if r % 2:
        return copy(est[r // 2])
    return (est[r // 2 - 1] + est[r // 2]) / 2


def heavy_hitters(table, h, k, device=None):
    """``(indices, estimates)``: the k positions (ascending int64) of largest estimated
    magnitude, and their estimates (float32). 1 <= k <= n. ``device``: as for ``unsketch``
    (then both are tensors there)."""
    return topk_exact(unsketch(table, h, device=device), k)
