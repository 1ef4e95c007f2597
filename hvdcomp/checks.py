"""Cross-rank checks of one batch, and the errors they raise (on every rank alike).

A batch is checked in three places of the step engine (``hvdcomp.engine``):

1. ``agree``: before anything else, every rank contributes a fingerprint of its batch's
   (name, shape, dtype) list; any difference raises ``RankMismatchError`` on every rank, naming
   the tensors and ranks.
2. ``verdict``: after one small all-gather of every tensor's status (``OK``, ``NONFINITE``,
   ``UNSUPPORTED``), an unsupported dtype raises ``UnsupportedTensorError`` and a NaN/Inf raises
   ``NonFiniteGradientError`` (or, with ``on_nonfinite='skip'``, asks for the step to be skipped),
   on every rank, since every rank sees the same gathered statuses.
3. ``reduction_factor``: in ``decompress``, the value Horovod reduced the 1-element placeholder
   to says which reduction op the user asked for.

``context(name)`` is the MPI context hvdcomp communicates on, refused with ``LaunchError`` when
Horovod runs ranks that MPI does not know (a Gloo launch).
"""
import hashlib
import sys

import numpy as np

from hvdcomp.comm import get_context
from hvdcomp.errors import (HvdcompError, LaunchError, NonFiniteGradientError, RankMismatchError,
                            UnsupportedTensorError)

OK, NONFINITE, UNSUPPORTED = 0, 1, 2


def horovod_world():
    """(size, rank) of an initialised Horovod (torch or TensorFlow), or None."""
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras"):
        mod = sys.modules.get(name)
        try:
            if mod is not None and mod.is_initialized():
                return mod.size(), mod.rank()
        except Exception:  # noqa: BLE001 - a half-imported module is not initialised
            continue
    return None


def context(who):
    """The ``CommContext`` for compressor ``who`` (its name, for messages)."""
    ctx = get_context()
    world = horovod_world()
    if world is not None and world != (ctx.size, ctx.rank):
        raise LaunchError(
            f"{who}: Horovod runs {world[0]} ranks (this is rank {world[1]}) but MPI "
            f"has {ctx.size} (rank {ctx.rank}): the job was not launched with MPI ranks "
            "(e.g. horovodrun --gloo). hvdcomp's all-reduce runs on MPI: launch with mpirun "
            "or horovodrun --mpi.")
    return ctx


def fingerprint(entries):
    """Two 26-bit integers (exact in float64) hashing the batch's (name, shape, dtype) list."""
    h = hashlib.blake2b(digest_size=8)
    for e in entries:
        h.update(f"{e.key}|{tuple(e.shape)}|{e.dtype_name}\n".encode())
    v = int.from_bytes(h.digest(), "little")
    return [float(v & 0x3FFFFFF), float((v >> 26) & 0x3FFFFFF)]


def agree(ctx, entries, who, step):
    """Raise ``RankMismatchError`` on every rank unless every rank holds the same batch (names,
    shapes and dtypes, in the same order). One small all-gather when the ranks agree."""
    header = np.asarray([len(entries)] + fingerprint(entries), dtype=np.float64)
    rows = ctx.allgather_array(header)
    if (rows == rows[0]).all():
        return
    lists = ctx.allgather_object([(e.key, e.numel, tuple(e.shape), e.dtype_name)
                                  for e in entries])
    counts = ", ".join(f"rank {r}: {len(items)}" for r, items in enumerate(lists))
    raise RankMismatchError(
        f"{who}: ranks disagree about the gradients of step {step} "
        f"(tensors per rank: {counts}): " + "; ".join(_differences(lists, ctx.size)[:10]))


def _differences(lists, size):
    """What differs between the ranks' (key, numel, shape, dtype) lists, one line per tensor."""
    per_key = {}
    for r, items in enumerate(lists):
        for key, numel, shape, dtype in items:
            per_key.setdefault(key, {})[r] = (numel, tuple(shape), dtype)
    problems = []
    for key in sorted(per_key):
        seen = per_key[key]
        missing = [r for r in range(size) if r not in seen]
        if missing:
            problems.append(f"{key!r} is missing on rank(s) {missing}")
        elif len(set(seen.values())) > 1:
            desc = ", ".join(f"rank {r}: {n} elements, shape {list(s)}, {d}"
                             for r, (n, s, d) in sorted(seen.items()))
            problems.append(f"{key!r} differs between ranks ({desc})")
    return problems


def verdict(entries, statuses, who, step, on_nonfinite):
    """From every rank's statuses (array (size, len(entries))): raise for an unsupported dtype
    or (``on_nonfinite='raise'``) a NaN/Inf; return True when the step is to be skipped."""
    bad = np.argwhere(statuses == UNSUPPORTED)
    if bad.size:
        r, i = bad[0]
        raise UnsupportedTensorError(
            f"{who}: tensor {entries[i].key!r} on rank {r} has dtype "
            f"{entries[i].dtype_name} (or is sparse); hvdcomp compresses dense floating-point "
            "gradients only (float16, bfloat16, float32, float64)")
    bad = np.argwhere(statuses == NONFINITE)
    if not bad.size:
        return False
    if on_nonfinite == "skip":
        return True
    where = ", ".join(f"{entries[i].key!r} on rank {r}" for r, i in bad[:8])
    raise NonFiniteGradientError(
        f"{who}: NaN or Inf in gradient {where} at step {step}; nothing was "
        "applied and the compressor state is unchanged (pass on_nonfinite='skip' to skip "
        "such steps with zero gradients instead)")


def reduction_factor(ctx, value, key, who):
    """1 for ``op=Average``, ``size`` for ``op=Sum``, from the reduced placeholder ``value``."""
    m = int(round(value))
    if m not in (1, ctx.size) or abs(value - m) > 1e-3 * m:
        raise HvdcompError(
            f"{who}: tensor {key!r} on rank {ctx.rank}: Horovod reduced the placeholder "
            f"to {value}; only op=Average (1) and op=Sum ({ctx.size}) are supported")
    return m
