"""Cross-rank checks of one batch, and the errors they raise (on every rank alike).

A batch is checked in three places of the step engine (``hvdcomp.engine``):

1. ``agree``: before anything is reduced, every rank contributes a fingerprint of its batch's
   (name, shape, dtype) list, its settings and loss scale; any difference raises
   ``RankMismatchError`` / ``SetupMismatchError`` on every rank, naming the tensors and ranks.
   The same all-gather finds the gradients that are all zeros on every rank (absent from the
   step) and a rank in ``hvd.join()`` (``announce_join``: ``JoinError`` on every rank).
2. ``verdict``: after one small all-gather of every tensor's status (``OK``, ``NONFINITE``,
   ``UNSUPPORTED``; skipped when ``agree`` saw every status OK and nothing is compressed), an
   unsupported dtype raises ``UnsupportedTensorError`` and a NaN/Inf raises
   ``NonFiniteGradientError`` (or, with ``on_nonfinite='skip'``, asks for the step to be skipped),
   on every rank, since every rank sees the same gathered statuses.
3. ``reduction_factor``: in ``decompress``, what Horovod reduced the placeholder
   (``placeholder_values``) to says which reduction op the user asked for
   (``confirm_op_refusal`` before refusing one).

At an optimizer's first gradient, ``inner_optimizer`` refuses a setting that cannot work with
it (every rank checks its own optimizer).

``context(name)`` is the MPI context hvdcomp communicates on, refused with ``LaunchError`` when
Horovod runs ranks that MPI does not know (a Gloo launch).
"""
import hashlib
import sys
import warnings
from typing import NamedTuple

import numpy as np

from hvdcomp.comm import get_context
from hvdcomp.errors import (DirectCallWarning, JoinError, LaunchError, NonFiniteGradientError,
                            RankMismatchError, SetupMismatchError, StateNotRestoredWarning,
                            UnsupportedOpError, UnsupportedOptimizerError, UnsupportedTensorError)

OK, NONFINITE, UNSUPPORTED = 0, 1, 2
# The first value of the header ``agree`` gathers, where it is not a batch's tensor count:
JOINED = -1.0  # the rank is in hvd.join() (``announce_join``)
OP_REFUSED = -2.0  # the rank refuses the step's reduction op (``confirm_op_refusal``)
HEADER = 13  # its length: count, 2 + 2 fingerprints, scale, zeros, their hash, not OK, window,
#              the step, the entries Horovod does not sum, the elements summed uncompressed


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


def context(who, ranks=None):
    """The ``CommContext`` for compressor ``who`` (its name, for messages): over every rank, or
    over the process set of world ``ranks``."""
    world = horovod_world()
    ctx = get_context()
    if world is not None and world != (ctx.size, ctx.rank):
        raise LaunchError(
            f"{who}: Horovod runs {world[0]} ranks (this is rank {world[1]}) but MPI "
            f"has {ctx.size} (rank {ctx.rank}): the job was not launched with MPI ranks "
            "(e.g. horovodrun --gloo). hvdcomp's all-reduce runs on MPI: launch with mpirun "
            "or horovodrun --mpi.")
    return ctx if ranks is None else get_context(ranks)


def fingerprint(entries, setup=None):
    """Two 26-bit integers (exact in float64) hashing the batch's (name, shape, dtype) list and
    the compressor's ``setup`` (class and settings, a dict of plain values)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(sorted((setup or {}).items())).encode())
    h.update(b"".join(e.signature() for e in entries))
    v = int.from_bytes(h.digest(), "little")
    return [float(v & 0x3FFFFFF), float((v >> 26) & 0x3FFFFFF)]


class Agreement(NamedTuple):
    """What ``agree`` found out besides the ranks' agreement: ``flagged``, whether some rank
    has an entry whose status is not ``OK``; ``absent``, the indices of the entries that are
    all zeros on every rank (a gradient nobody computed: a frozen parameter, an unused branch,
    Horovod's zero fill for a missing gradient); ``window``: the largest rank's ``window``
    (``hvdcomp.decision``); ``dense_sizes``: every rank's ``dense`` (``agree``), in rank
    order."""
    flagged: bool
    absent: frozenset
    window: float = 0.0
    all_by_horovod: bool = False
    dense_sizes: tuple = ()


def agree(ctx, entries, who, step, setup, loss_scale=1.0, window=0.0, dense=0):
    """Raise on every rank unless every rank holds the same batch (names, shapes and dtypes, in
    the same order; ``RankMismatchError``) of the same ``step`` and reduces it with the same
    compressor ``setup`` (class and settings; ``SetupMismatchError``) at the same
    ``loss_scale``. One small all-gather when the ranks agree (a second, of one flag per entry,
    only when the ranks' all-zero entries (``entry.zero``) differ). ``window``: a number every
    rank contributes, of which the ``Agreement`` holds the largest; ``all_by_horovod``: whether
    Horovod sums every entry on every rank (``Entry.by_horovod``); ``dense``: the elements of
    this rank's uncompressed sum (its OK entries that hvdcomp sums uncompressed), gathered as
    ``dense_sizes`` for ``same_dense_size``. Returns an ``Agreement``."""
    zeros = [i for i, e in enumerate(entries) if e.zero]
    header = np.asarray([len(entries)] + fingerprint(entries) + fingerprint([], setup)
                        + [loss_scale, len(zeros), _hash26(zeros)]
                        + [sum(e.status != OK for e in entries), window, step,
                           sum(not e.by_horovod for e in entries), dense], dtype=np.float64)
    rows = ctx.allgather_array(header)
    _refuse_join(rows, ctx, who, step)
    if not (rows[:, 10] == rows[0, 10]).all():
        steps = ", ".join(f"rank {r}: {int(v)}" for r, v in enumerate(rows[:, 10]))
        raise RankMismatchError(
            f"{who}: ranks reduce different steps ({steps}): their batches did not match step "
            f"for step (a rank reduced tensors the others left to Horovod) (raised on rank "
            f"{ctx.rank})")
    if (rows[:, :6] == rows[0, :6]).all():
        if (rows[:, 6:8] == rows[0, 6:8]).all():
            absent = frozenset(zeros)
        else:
            flags = ctx.allgather_array([e.zero for e in entries], dtype=np.uint8)
            absent = frozenset(np.flatnonzero(flags.all(axis=0)).tolist())
        return Agreement(bool(rows[:, 8].any()), absent, float(rows[:, 9].max()),
                         not rows[:, 11].any(), tuple(rows[:, 12].astype(np.int64).tolist()))
    if not (rows[:, 3:5] == rows[0, 3:5]).all():
        setups = ctx.allgather_object(setup)
        raise SetupMismatchError(
            f"{who}: ranks use different compressors or settings at step {step}: "
            + "; ".join(_setup_differences(setups)) + ". Pass the same compression=... "
            f"(class and arguments) on every rank (raised on rank {ctx.rank}).")
    if (rows[:, :5] == rows[0, :5]).all():
        scales = ", ".join(f"rank {r}: {v:g}" for r, v in enumerate(rows[:, 5]))
        raise SetupMismatchError(
            f"{who}: ranks reduce step {step} at different loss scales ({scales}); every rank "
            "must scale its loss alike (one GradScaler per rank, updated after every step, or "
            f"the same hvdcomp.set_loss_scale()) (raised on rank {ctx.rank})")
    lists = ctx.allgather_object([(e.key, e.numel, tuple(e.shape), e.dtype_name)
                                  for e in entries])
    counts = ", ".join(f"rank {r}: {len(items)}" for r, items in enumerate(lists))
    raise RankMismatchError(
        f"{who}: ranks disagree about the gradients of step {step} "
        f"(tensors per rank: {counts}): " + "; ".join(_differences(lists, ctx.size)[:10])
        + f" (raised on rank {ctx.rank})")


def announce_join(ctx):
    """What a rank entering ``hvd.join()`` does first (``hvdcomp.facade.frontends.torch``): one
    all-gather shaped like ``agree``'s header, which a rank still training meets in its next
    step's ``agree`` (or ``confirm_op_refusal``). Returns when every rank has joined; else
    ``JoinError`` here and, from the same all-gather, on the ranks still training."""
    header = np.zeros(HEADER)
    header[0] = JOINED
    rows = ctx.allgather_array(header)
    training = [r for r in range(ctx.size) if rows[r, 0] != JOINED]
    if training:
        raise JoinError(
            f"hvdcomp: this rank called hvd.join() while rank(s) {training} still train. "
            + _JOIN_ADVICE + f" (raised on rank {ctx.rank})")


def confirm_op_refusal(ctx):
    """Before a rank raises ``UnsupportedOpError`` (its reduced placeholder shows no mean or
    sum): every rank that refuses the op meets here, and a rank in ``hvd.join()``
    (``announce_join``), whose zero contribution also changes the placeholder, turns it into a
    ``JoinError`` on every rank."""
    header = np.zeros(HEADER)
    header[0] = OP_REFUSED
    _refuse_join(ctx.allgather_array(header), ctx, "hvdcomp", None)


_JOIN_ADVICE = (
    "hvdcomp's compressed reduction needs every rank in every step, so ranks cannot take "
    "different numbers of steps and hvd.join() them (Horovod's own allreduce can). Give every "
    "rank the same number of steps: e.g. torch's DistributedSampler (it gives every rank a "
    "shard of one length), or stop every rank after the shortest shard's steps "
    "(hvd.allreduce(torch.tensor(len(loader)), op=hvd.Min)); or use "
    "compression=hvd.Compression.none for a job that needs hvd.join()")


def _refuse_join(rows, ctx, who, step):
    """``JoinError`` if some rank's gathered header says it is in ``hvd.join()``."""
    joined = [r for r in range(ctx.size) if rows[r, 0] == JOINED]
    if joined:
        at = "" if step is None else f" at step {step}"
        raise JoinError(
            f"{who}: rank(s) {joined} called hvd.join() while this rank still trains{at}. "
            + _JOIN_ADVICE + f" (raised on rank {ctx.rank})")


def _hash26(values):
    """A 26-bit hash of a list of ints (exact in float64)."""
    h = hashlib.blake2b(repr(values).encode(), digest_size=4).digest()
    return float(int.from_bytes(h, "little") & 0x3FFFFFF)


def _setup_differences(setups):
    """One line per setting that differs between ranks: ``'seed': rank 0: 1, rank 1: 2``."""
    keys = sorted({k for s in setups for k in s})
    lines = []
    for k in keys:
        values = [s.get(k, "(not set)") for s in setups]
        if len({repr(v) for v in values}) > 1:
            lines.append(f"{k!r}: " + ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values)))
    return lines


def agree_names(ctx, names, who, what):
    """Raise ``RankMismatchError`` on every rank unless every rank gives the same sorted list of
    tensor ``names`` (e.g. the parameters an optimizer will reduce: ``what`` says which)."""
    names = sorted(names)
    h = hashlib.blake2b(repr(names).encode(), digest_size=8).digest()
    v = int.from_bytes(h, "little")
    rows = ctx.allgather_array([len(names), v & 0x3FFFFFF, (v >> 26) & 0x3FFFFFF])
    if (rows == rows[0]).all():
        return
    lists = ctx.allgather_object(names)
    union = sorted(set().union(*map(set, lists)))
    problems = [f"{n!r} only on rank(s) {[r for r, ns in enumerate(lists) if n in ns]}"
                for n in union if any(n not in ns for ns in lists)]
    raise RankMismatchError(
        f"{who}: ranks disagree about {what} (per rank: "
        + ", ".join(f"rank {r}: {len(ns)}" for r, ns in enumerate(lists)) + "): "
        + "; ".join(problems[:10]) + ". Every rank must train the same parameters (same model, "
        f"same requires_grad) (raised on rank {ctx.rank}).")


def inner_optimizer(who, setting, found, rank):
    """Raise ``UnsupportedOptimizerError`` where compressor ``who`` (its name) has a ``setting``
    whose result is the optimizer's step itself (it carries its own momentum and normaliser:
    BinSGDM, ``precondition='adam'``; None: no such setting) and the user's optimizer is neither
    plain SGD without momentum (or with it, where the compressor adapts to it:
    ``Method.under_sgd_momentum``) nor an Adam/AdamW whose moments hvdcomp sets
    (``hvdcomp.preconditioning.ThroughAdam``): ``found`` describes it (the adapter's
    ``optimizer_kind``; None: plain SGD, such an Adam, or one the adapter cannot tell). Every
    rank checks its own optimizer at its first gradient, before anything is communicated."""
    if setting is None or found is None:
        return
    raise UnsupportedOptimizerError(
        f"{who}: {setting} returns the optimizer's step itself (it carries momentum and a "
        "per-coordinate normaliser), so the optimizer inside hvd.DistributedOptimizer must be "
        "plain SGD (without momentum for precondition='adam', at an Adam-like rate; BinSGDM "
        "also with momentum, at SGD's usual rate), or Adam/AdamW (without "
        f"amsgrad or maximize, beta2 > 0), whose moments hvdcomp then sets; this one is {found}, "
        "which would apply its own momentum or normalisation on top (training stalls or "
        "diverges). Use plain SGD (torch.optim.SGD(params, lr=..., momentum=0), "
        "tf.keras.optimizers.SGD(lr)) or Adam, or keep your optimizer and compress without "
        f"{setting} (e.g. compression=hvdcomp.Marsit) (raised on rank {rank})")


def resumed_without_state(who, steps, rank):
    """Warn (``StateNotRestoredWarning``, once per compressor and optimizer) where the user's
    optimizer has taken ``steps`` steps before its first gradient reaches compressor ``who`` (its
    name), whose state is empty: a resume from a checkpoint that holds the model and optimizer
    but not the compressor. Every rank loaded the same checkpoint, so every rank warns."""
    if not steps:
        return
    warnings.warn(
        f"hvdcomp {who}: the optimizer resumes after {steps} step(s) (its state was loaded), "
        "but this compressor starts with empty state: what it kept of the steps before the "
        "checkpoint (error memory, momentum) is lost, and training continues on another trajectory than without the "
        "interruption. Save the compressor's state with your checkpoint "
        "(state = compression.state_dict(all_ranks=True), called on every rank, saved by rank 0) "
        "and restore it after loading the optimizer (compression.load_state_dict(state)); on "
        "another number of ranks it cannot be re-split, and starting empty is the only choice "
        f"(raised on rank {rank})", StateNotRestoredWarning, stacklevel=2)


def direct_call_compressed(who, name, rank):
    """Warn once (``DirectCallWarning``) that compressor ``who`` compresses a direct
    ``hvd.allreduce``/``grouped_allreduce`` call (``name``, the first) as a gradient."""
    warnings.warn(
        f"hvdcomp {who}: hvd.allreduce(name={name!r}) and the other direct calls to this "
        "compressor, which serves no optimizer, are compressed as gradients of your own "
        "training loop: each "
        "result is the ranks' mean plus a compression error that error feedback carries into the "
        "next call of the same name. That is right for gradients applied every step, wrong for a "
        "value you read (a metric, a count): reduce those with compression=hvd.Compression.none "
        "(a compressor that serves an optimizer sums direct calls of new names exactly) "
        f"(raised on rank {rank})", DirectCallWarning, stacklevel=2)


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


def verdict(entries, statuses, who, step, on_nonfinite, rank):
    """From every rank's statuses (array (size, len(entries))): raise for an unsupported dtype
    or (``on_nonfinite='raise'``) a NaN/Inf; otherwise return the ``(rank, entry index)`` pairs
    of non-finite tensors (empty: the step goes on; else it is skipped, ``on_nonfinite`` says
    how). ``rank``: this rank, named in the message as the one that raised it."""
    bad = np.argwhere(statuses == UNSUPPORTED)
    if bad.size:
        r, i = bad[0]
        raise UnsupportedTensorError(
            f"{who}: tensor {entries[i].key!r} on rank {r} has dtype "
            f"{entries[i].dtype_name} (or is sparse); hvdcomp compresses dense floating-point "
            f"gradients only (float16, bfloat16, float32, float64) (raised on rank {rank})")
    bad = np.argwhere(statuses == NONFINITE)
    if not bad.size or on_nonfinite != "raise":
        return [(int(r), int(i)) for r, i in bad]
    where = ", ".join(f"{entries[i].key!r} on rank {r}" for r, i in bad[:8])
    raise NonFiniteGradientError(
        f"{who}: NaN or Inf in gradient {where} at step {step}; nothing was "
        "applied and the compressor state is unchanged (pass on_nonfinite='propagate' to "
        "return NaN for such tensors instead, as Horovod's allreduce does, e.g. for AMP's "
        f"GradScaler, or on_nonfinite='skip' to return zeros) (raised on rank {rank})")


def same_dense_size(sizes, who, step, rank):
    """Raise ``RankMismatchError`` on every rank where the ranks' uncompressed sums of a step
    would differ in size (``sizes``: every rank's element count, gathered): an all-reduce of
    other sizes fails on some ranks and leaves the others waiting for ever. The names, shapes
    and settings are agreed before, so this is hvdcomp's own state differing between ranks
    (e.g. an error-feedback memory carried on some ranks only), caught before anything is
    sent; the step is abandoned, its state rolled back."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if (sizes == sizes[0]).all():
        return
    each = ", ".join(f"rank {r}: {int(n):,}" for r, n in enumerate(sizes))
    raise RankMismatchError(
        f"{who}: the uncompressed sum of step {step} would have different sizes on the ranks "
        f"({each} elements): hvdcomp's state differs between ranks (a bug; please report it). "
        f"Nothing was sent or applied and the state is unchanged (raised on rank {rank})")


def placeholder_values(world_rank):
    """What a rank sends through Horovod's allreduce in place of a gradient: ``[1, 1 + rank]``
    (``rank``: its MPI world rank). Over ranks R (the world or the process set), op=Average
    gives ``[1, 1 + mean(R)]`` and op=Sum ``n * [1, 1 + mean(R)]``; any pre-/postscale factor
    ``s`` multiplies both. Min, Max, Product and Adasum give other vectors."""
    return [1.0, 1.0 + float(world_rank)]


def reduction_factor(values, ranks, key, who, rank):
    """The factor by which the mean over ``ranks`` (world ranks) is to be multiplied, from the
    reduced placeholder ``values``: 1 for op=Average, ``len(ranks)`` for op=Sum, times any
    prescale/postscale factor. Raises ``UnsupportedOpError`` for every other reduction. A
    1-element ``values`` is an unreduced host placeholder (NumPy): factor 1."""
    if len(values) == 1:
        return 1.0
    scale, second = float(values[0]), float(values[1])
    expected = 1.0 + sum(ranks) / len(ranks)
    if np.isfinite(scale) and scale != 0 and abs(second / scale - expected) <= 1e-4 * expected:
        return scale
    n = len(ranks)
    raise UnsupportedOpError(
        f"{who}: tensor {key!r} on rank {rank}: Horovod's reduction turned hvdcomp's placeholder "
        f"[1, 1 + rank] into {[float(v) for v in values]}, not op=Average ([1, {expected:g}]) or "
        f"op=Sum ([{n}, {n * expected:g}]) (up to a prescale/postscale factor). hvdcomp "
        "reduces by mean or sum only: op=hvd.Min, hvd.Max, hvd.Product and hvd.Adasum are not "
        "supported. Use op=hvd.Average or hvd.Sum, or compression=hvd.Compression.none for "
        "this reduction.")
