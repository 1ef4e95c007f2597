"""LayerFusion: choose gradient buckets (contiguous runs of layers) for any compressor.

Pure functions, no MPI. Layers are given in *backward order* (the order their gradients become
ready). The model of a step's communication:

- layer i's gradient is ready at ``R_i = backward_times[0] + ... + backward_times[i]``;
- a bucket (layers lo..hi-1) is one message costing ``latency + bytes / bandwidth`` seconds
  (for a compressor, measure both end to end: encode + collective + decode, e.g. with
  ``fit_cost_model`` on timed reductions of a few sizes);
- a bucket's message starts when its last layer is ready and the previous bucket's message has
  finished (one message at a time, in order);
- the step ends when the last message finishes.

``plan_buckets`` minimises that end time over all splits into contiguous buckets by dynamic
programming (``F[j] = min_i max(R_j, F[i]) + cost(i..j)``; optimal because the end time is
non-decreasing in the previous bucket's finish), O(L^2) work vectorised over i. Without
measurements (no backward times, latency or bandwidth) it falls back to a size rule: buckets
closed as soon as they reach ``fallback_bytes`` (default 4 MB), or one bucket when
``fallback_bytes`` is None. Layer-wise compression (one bucket per layer) and whole-step fusion
(one bucket) are the two extremes; ``estimate`` prices any plan under the same model.
"""
from collections import namedtuple

import numpy as np

DEFAULT_FALLBACK_BYTES = 4 << 20

Plan = namedtuple("Plan", ["buckets", "time", "rule"])
Plan.__doc__ = """``buckets``: list of ``(lo, hi)`` layer ranges (hi exclusive) covering 0..L in
order; ``time``: the model's estimated end of the step in seconds (None for the fallback rule);
``rule``: 'dp' or 'fallback'."""


def _ready_times(backward_times):
    return np.cumsum(np.asarray(backward_times, dtype=np.float64))


def estimate(buckets, sizes, backward_times, latency, bandwidth):
    """The model's end time (seconds) of the step split into ``buckets`` (see module doc)."""
    ready = _ready_times(backward_times)
    sizes = np.asarray(sizes, dtype=np.float64)
    t = 0.0
    for lo, hi in buckets:
        t = max(ready[hi - 1], t) + latency + sizes[lo:hi].sum() / bandwidth
    return float(t)


def _fallback(sizes, fallback_bytes):
    if fallback_bytes is None:
        return [(0, len(sizes))]
    buckets, lo, acc = [], 0, 0
    for i, s in enumerate(sizes):
        acc += s
        if acc >= fallback_bytes:
            buckets.append((lo, i + 1))
            lo, acc = i + 1, 0
    if lo < len(sizes):
        buckets.append((lo, len(sizes)))
    return buckets


def plan_buckets(sizes, backward_times=None, *, latency=None, bandwidth=None,
                 fallback_bytes=DEFAULT_FALLBACK_BYTES):
    """Bucket boundaries minimising the estimated step end time.

    Args:
        sizes: bytes of each layer's gradient message (as the compressor sends it, or its
            dense size if the cost model is fitted on dense sizes), in backward order.
        backward_times: seconds of each layer's backward computation (same order), or None.
        latency: fixed seconds per message (>= 0), or None.
        bandwidth: bytes per second (> 0, ``float('inf')`` allowed), or None.
        fallback_bytes: the size rule used when any of the three measurements is missing.
    Returns:
        a ``Plan``. Ties are broken towards fewer buckets.
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    n = sizes.shape[0]
    if n == 0:
        return Plan([], 0.0, "dp")
    if backward_times is None or latency is None or bandwidth is None:
        return Plan(_fallback(sizes, fallback_bytes), None, "fallback")
    if len(backward_times) != n:
        raise ValueError(f"{n} sizes but {len(backward_times)} backward times")
    if latency < 0 or not bandwidth > 0:
        raise ValueError(f"need latency >= 0 and bandwidth > 0, got {latency}, {bandwidth}")
    ready = _ready_times(backward_times)
    csum = np.concatenate([[0.0], np.cumsum(sizes)])
    finish = np.zeros(n + 1)  # finish[j]: best end time of layers 0..j-1 (finish[0] = 0)
    start = np.zeros(n + 1, dtype=np.int64)  # start[j]: first layer of the last bucket
    for j in range(1, n + 1):
        i = np.arange(j)  # candidate last bucket: layers i..j-1
        t = np.maximum(ready[j - 1], finish[:j]) + latency + (csum[j] - csum[:j]) / bandwidth
        best = int(np.flatnonzero(t <= t.min())[0])  # the longest last bucket among ties
        finish[j], start[j] = t[best], i[best]
    buckets, j = [], n
    while j > 0:
        buckets.append((int(start[j]), j))
        j = int(start[j])
    return Plan(buckets[::-1], float(finish[n]), "dp")


def layerwise(n_layers):
    """One bucket per layer: ``[(0, 1), (1, 2), ...]``."""
    return [(i, i + 1) for i in range(n_layers)]


def fit_cost_model(nbytes, seconds):
    """``(latency, bandwidth)`` from timed messages: least squares of ``seconds = latency +
    nbytes / bandwidth`` (latency clipped to >= 0; bandwidth inf when time does not grow)."""
    x, y = np.asarray(nbytes, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    slope, icept = np.polyfit(x, y, 1) if len(set(x.tolist())) > 1 else (0.0, float(y.mean()))
    return max(float(icept), 0.0), (1.0 / slope if slope > 0 else float("inf"))
