"""The Horovod ``Compressor`` protocol for methods whose reduction Horovod's sum cannot do.

How a step flows (PyTorch's stock ``hvd.DistributedOptimizer``; the same for ``hvd.allreduce``):

1. ``compress(grad)`` records the gradient under its Horovod name and returns a 1-element
   placeholder (value 1) that Horovod all-reduces in place of the gradient. No MPI happens here,
   so it is safe in autograd hooks.
2. The first ``decompress(output, ctx)`` of the step *flushes*: all gradients recorded since the
   last flush are processed together, sorted by name, so the order of hvdcomp's own collectives
   is the same on every rank by construction (Horovod's ``synchronize()`` walks parameters in an
   order that can differ between ranks). Every compress of a step precedes its first decompress.
3. A flush first agrees on the batch: every rank contributes a fingerprint of its
   (name, shape, dtype) list; any difference raises ``RankMismatchError`` on every rank, naming
   the tensors and ranks. Then one small all-gather carries each tensor's status (finite,
   supported dtype) and the method's per-tensor scalars; a NaN/Inf or an unsupported dtype on any
   rank raises on every rank (or, with ``on_nonfinite='skip'``, the whole step's gradients are
   returned as zeros and no state changes).
4. Tensors with fewer than ``min_compress_numel`` elements are fused and summed uncompressed
   (float ring all-reduce); the others are fused and handed to the method's ``_reduce``.
5. ``decompress`` returns the mean over ranks, multiplied by the Horovod placeholder's reduced
   value (1 for ``op=Average``, size for ``op=Sum``), shaped and typed like the gradient.

LayerFusion (``fusion='auto'``, see ``hvdcomp.bucketing``): instead of one batch at the first
decompress, the step's gradients are reduced in buckets chosen from measured backward timing and
message cost, by a background thread as soon as a bucket's gradients are all compressed (so
communication overlaps the backward pass); each bucket goes through steps 3-5 above, the rest of
the step is one final batch at the first decompress, and errors keep whole-step semantics (the
state is rolled back and the error raised on every rank). ``fusion='step'`` is the one-batch
flow above. ``fusion_plan``/``describe_fusion()`` show the buckets in use.

Instances hold per-tensor state (``_memory``, keyed by name) and are checkpointable with
``state_dict()``/``load_state_dict()``. The class itself can be passed as ``compression=``:
its methods then act on one default instance per class (``Cls.default()``).
"""
import hashlib
import numbers
import os
import threading
import time
import weakref

import numpy as np

from hvdcomp import bucketing
from hvdcomp.algorithms import adam
from hvdcomp.algorithms import precondition as rms
from hvdcomp.backend import xp
from hvdcomp.comm import get_context, ring_allreduce
from hvdcomp.errors import (HvdcompError, LaunchError, NonFiniteGradientError,
                            RankMismatchError, UnsupportedTensorError)
from hvdcomp.frontends import adapter_for
from hvdcomp.stats import StepStats

OK, NONFINITE, UNSUPPORTED = 0, 1, 2
DEFAULT_MIN_COMPRESS_NUMEL = 1024
PRECONDITIONERS = (None, "rms", "adam")
# The fusion mode of compressors built without ``fusion=`` (see hvdcomp.bucketing).
DEFAULT_FUSION = os.environ.get("HVDCOMP_FUSION", "step")


class default_instance:
    """Method decorator: called on the class, act on ``cls.default()``; on an instance, as usual."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        return self.fn.__get__(cls.default() if obj is None else obj, cls)


class _Ticket:
    """The ``ctx`` Horovod hands back to ``decompress``."""
    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key


class Entry:
    """One gradient of the current batch."""
    __slots__ = ("key", "ticket", "adapter", "work", "shape", "dtype", "device", "dtype_name",
                 "numel", "status", "scratch", "pre_state", "dense")

    def __init__(self, key, tensor, adapter, working_dtype):
        self.key, self.ticket, self.adapter = key, _Ticket(key), adapter
        self.shape, self.dtype, self.device = adapter.meta(tensor)
        self.dtype_name = adapter.describe_dtype(tensor)
        self.numel = int(np.prod(self.shape, dtype=np.int64))
        self.status = OK if adapter.is_supported(tensor) else UNSUPPORTED
        self.work = adapter.working(tensor, working_dtype) if self.status == OK else None
        self.scratch = None  # method-specific per-step data (e.g. the compensated vector)
        self.pre_state = None  # precondition's state after this step, stored if the step lands
        self.dense = False  # reduce uncompressed this step (small tensor, or an 'adam' warm-up)


def _is_count(value):
    """An integer >= 0 (numbers.Integral, numpy's included; not bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def horovod_world():
    """(size, rank) of an initialised Horovod (torch or TensorFlow), or None."""
    import sys
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras"):
        mod = sys.modules.get(name)
        try:
            if mod is not None and mod.is_initialized():
                return mod.size(), mod.rank()
        except Exception:  # noqa: BLE001 - a half-imported module is not initialised
            continue
    return None


def fingerprint(entries):
    """Two 26-bit integers (exact in float64) hashing the batch's (name, shape, dtype) list."""
    h = hashlib.blake2b(digest_size=8)
    for e in entries:
        h.update(f"{e.key}|{tuple(e.shape)}|{e.dtype_name}\n".encode())
    v = int.from_bytes(h.digest(), "little")
    return [float(v & 0x3FFFFFF), float((v >> 26) & 0x3FFFFFF)]


class BatchedCompressor:
    """Base of hvdcomp's compressors (see the module docstring for the protocol).

    Subclasses implement ``_prepare(entries) -> float64 array (len(entries), n_scalars)`` (local
    per-tensor scalars, computed before anything is communicated or any state changes) and
    ``_reduce(entries, scalars) -> list of flat arrays`` (``scalars``: shape
    (size, len(entries), n_scalars), every rank's), returning the mean over ranks per entry, on
    the entry's device, and updating the method's state.

    Common args: ``min_compress_numel``, ``on_nonfinite`` ('raise'/'skip'), ``seed``;
    ``fusion``: 'step' (one batch per step), 'auto' (LayerFusion, ``hvdcomp.bucketing``) or
    'layerwise' (one bucket per tensor, for comparisons); default ``DEFAULT_FUSION``;
    ``fusion_cost``: optional ``(latency s, bandwidth B/s)`` of one bucket's reduction for 'auto'
    (default: measured from the compressor's own timed reductions);
    ``precondition``: None (default: the gradients are reduced as they are); 'rms' (each rank
    divides its gradients by their own running root mean square per coordinate before
    compressing, and the result is the mean normalised gradient: Adam's per-coordinate scaling
    survives the compression; ``hvdcomp.algorithms.precondition``); or 'adam' /
    ``hvdcomp.AdamSettings(betas, eps, warmup)`` (the compressor carries Adam, compresses each
    rank's momentum after a dense warm-up and returns Adam's step direction, for a plain SGD
    inner optimizer at Adam's learning rate; ``hvdcomp.algorithms.adam``).
    """

    method = "base"
    n_scalars = 0
    working_dtype = "float32"

    def __init__(self, *, min_compress_numel=DEFAULT_MIN_COMPRESS_NUMEL, on_nonfinite="raise",
                 seed=0, fusion=None, fusion_cost=None, precondition=None):
        self.adam = None
        if isinstance(precondition, adam.AdamSettings):
            precondition, self.adam = "adam", precondition
        elif precondition not in PRECONDITIONERS:
            raise ValueError(f"precondition must be one of {PRECONDITIONERS} or an "
                             f"hvdcomp.AdamSettings, got {precondition!r}")
        elif precondition == "adam":
            self.adam = adam.AdamSettings()
        self.precondition = precondition
        if not _is_count(min_compress_numel):
            raise ValueError(f"min_compress_numel must be an int >= 0, got {min_compress_numel!r}")
        if not _is_count(seed):
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
        self.min_compress_numel = int(min_compress_numel)
        self.on_nonfinite = on_nonfinite
        self.seed = int(seed)
        self._pending = []
        self._results = {}
        self._memory = {}
        self._scratch = {}  # key -> reusable work buffer (not state: never saved or restored)
        self._step = 0
        self._batch = 0  # index of the next batch within the step (LayerFusion buckets)
        self._skipped = 0
        self._owners = {}  # key -> weakref to the parameter whose state is stored under key
        self._lock = threading.Lock()
        self._phases = {}
        self.last_stats = None
        self.total_stats = StepStats()
        mode = DEFAULT_FUSION if fusion is None else fusion
        if mode not in bucketing.MODES:
            raise ValueError(f"fusion must be one of {bucketing.MODES}, got {mode!r}")
        if mode != "auto" and fusion_cost is not None:
            raise ValueError(f"fusion_cost applies to fusion='auto' only (fusion={mode!r})")
        self._fusion = None if mode == "step" else bucketing.Scheduler(self, mode, fusion_cost)

    # -- class used bare: one default instance per class -------------------------------------
    @classmethod
    def default(cls):
        """The instance that ``Cls.compress``/``Cls.decompress`` use when the class is passed."""
        inst = cls.__dict__.get("_default")
        if inst is None:
            inst = cls()
            setattr(cls, "_default", inst)
        return inst

    # -- the Horovod Compressor protocol ------------------------------------------------------
    @default_instance
    def compress(self, tensor):
        """Record ``tensor`` for this step's batch; return (1-element placeholder, ctx)."""
        adapter = adapter_for(tensor)
        name, owner = adapter.tensor_identity(tensor)
        if getattr(adapter, "DEFERRED", False):
            # Graph frameworks (TensorFlow): this runs once, at trace time. The adapter builds,
            # in decompress(), a per-step op that calls reduce_now() with the gradient's value.
            with self._lock:
                if name is not None:
                    self._check_owner(name, owner)
            return adapter.placeholder(tensor), adapter.Deferred(self, name, tensor)
        with self._lock:
            key = name if name is not None else f"@{len(self._pending):06d}"
            self._check_owner(key, owner)
            if any(e.key == key for e in self._pending):
                raise HvdcompError(
                    f"{self.method}: tensor {key!r} was compressed twice before decompress(). If "
                    "several optimizers share a compressor, give each its own instance, e.g. "
                    f"compression=hvdcomp.{type(self).__name__}().")
            entry = Entry(key, tensor, adapter, self.working_dtype)
            self._pending.append(entry)
            if self._fusion is not None:
                self._fusion.arrived(entry)
        return adapter.placeholder(tensor), entry.ticket

    def _check_owner(self, key, owner):
        """State is keyed by name: refuse a second parameter under a name already in use (two
        optimizers sharing one compressor whose models use the same parameter names)."""
        if owner is None:
            return
        known = self._owners.get(key)
        if known is not None and known() is not None and known() is not owner:
            raise HvdcompError(
                f"{self.method}: two different parameters are both named {key!r} in one "
                "compressor, so their state would mix. When several optimizers share a "
                "compressor, give each its own instance: compression="
                f"hvdcomp.{type(self).__name__}().")
        self._owners[key] = weakref.ref(owner)

    @default_instance
    def decompress(self, output, ctx):
        """The reduced gradient for ``ctx`` (flushing the batch on the first call of a step)."""
        if getattr(ctx, "DEFERRED", False):
            return ctx.build(output)
        if ctx is None and getattr(output, "is_sparse", False) is True:
            # A sparse torch gradient (e.g. nn.Embedding(sparse=True)) without sparse_as_dense:
            # horovod.torch reduced it itself (uncompressed all-gather of indices and values,
            # already averaged) without calling compress(); it hands us the result, ctx None.
            return output
        with self._lock:
            if any(e.ticket is ctx for e in self._pending):
                self._flush()
            elif ctx not in self._results:
                raise HvdcompError(f"{self.method}: decompress() got a ctx it did not issue")
            flat, entry = self._results.pop(ctx)
        factor = self._reduction_factor(entry.adapter.scalar(output), entry.key)
        if factor != 1:
            flat = flat * factor
        return entry.adapter.restore(flat, entry.shape, entry.dtype, entry.device)

    # -- checkpoints ---------------------------------------------------------------------------
    @default_instance
    def state_dict(self, all_ranks=False):
        """This rank's state (step, seed, per-tensor memory as NumPy arrays), or with
        ``all_ranks=True`` every rank's, gathered on every rank (a collective: call it on all
        ranks; rank 0 can then save one file that restores every rank)."""
        ctx = self._context()
        local = {"method": self.method, "format": 1, "rank": ctx.rank, "size": ctx.size,
                 "step": self._step, "seed": self.seed, "skipped": self._skipped,
                 "memory": {k: self._state_to_host(v) for k, v in sorted(self._memory.items())}}
        if self._fusion is not None:
            local["fusion"] = self._fusion.state()
        if not all_ranks:
            return local
        return {"method": self.method, "format": 1, "size": ctx.size,
                "ranks": ctx.allgather_object(local)}

    @default_instance
    def load_state_dict(self, state):
        """Restore what ``state_dict()`` returned (this rank's, or the all-ranks form)."""
        ctx = self._context()
        if state.get("method") != self.method:
            raise HvdcompError(f"{self.method}: checkpoint holds {state.get('method')!r} state")
        if state.get("size") != ctx.size:
            raise HvdcompError(
                f"{self.method}: checkpoint was written by {state.get('size')} ranks, this job has "
                f"{ctx.size}; per-rank compressor memory cannot be re-split")
        if "ranks" in state:
            state = state["ranks"][ctx.rank]
        elif state.get("rank") != ctx.rank:
            raise HvdcompError(f"{self.method}: rank {ctx.rank} was given rank "
                               f"{state.get('rank')}'s state")
        with self._lock:
            if self._pending:
                raise HvdcompError(f"{self.method}: load_state_dict() in the middle of a step")
            self._step, self.seed = int(state["step"]), int(state["seed"])
            self._skipped = int(state.get("skipped", 0))
            self._memory = {k: self._state_from_host(v) for k, v in state["memory"].items()}
            if self._fusion is not None:
                self._fusion.load(state.get("fusion"))

    @staticmethod
    def _state_to_host(value):
        if isinstance(value, tuple):
            return tuple(np.array(xp.to_host(v), copy=True) for v in value)
        return np.array(xp.to_host(value), copy=True)

    @staticmethod
    def _state_from_host(value):
        if isinstance(value, tuple):
            return tuple(np.array(v, copy=True) for v in value)
        return np.array(value, copy=True)

    def memory_like(self, key, like):
        """The stored state for ``key`` as the same kind/device as ``like``, or None."""
        value = self._memory.get(key)
        if value is None:
            return None
        if isinstance(value, tuple):
            value = tuple(self._to_kind(v, like) for v in value)
        else:
            value = self._to_kind(value, like)
        self._memory[key] = value
        return value

    def scratch_like(self, key, like):
        """A work buffer with ``like``'s shape, dtype and kind/device, kept for ``key`` across
        steps so a hot path does not allocate (and page in) a fresh vector every step. Its
        contents are garbage on entry; it is not state (``state_dict`` leaves it out)."""
        buf = self._scratch.get(key)
        if (buf is None or xp.is_torch(buf) != xp.is_torch(like) or buf.shape != like.shape
                or buf.dtype != like.dtype or getattr(buf, "device", None)
                != getattr(like, "device", None)):
            buf = self._scratch[key] = xp.empty_like(like)
        return buf

    @staticmethod
    def _to_kind(value, like):
        if xp.is_torch(like) and not xp.is_torch(value):
            return xp.from_host(value, like)
        if xp.is_torch(like) and value.device != like.device:
            return value.to(like.device)
        return value

    # -- internals -----------------------------------------------------------------------------
    def _context(self):
        ctx = get_context()
        world = horovod_world()
        if world is not None and world != (ctx.size, ctx.rank):
            raise LaunchError(
                f"{self.method}: Horovod runs {world[0]} ranks (this is rank {world[1]}) but MPI "
                f"has {ctx.size} (rank {ctx.rank}): the job was not launched with MPI ranks "
                "(e.g. horovodrun --gloo). hvdcomp's all-reduce runs on MPI: launch with mpirun "
                "or horovodrun --mpi.")
        return ctx

    def _reduction_factor(self, value, key):
        ctx = self._context()
        m = int(round(value))
        if m not in (1, ctx.size) or abs(value - m) > 1e-3 * m:
            raise HvdcompError(
                f"{self.method}: tensor {key!r} on rank {ctx.rank}: Horovod reduced the placeholder "
                f"to {value}; only op=Average (1) and op=Sum ({ctx.size}) are supported")
        return m

    def _phase(self, name):
        return _Phase(self._phases, name)

    def reduce_now(self, key, array, reduced_placeholder):
        """Reduce one host array (NumPy) across ranks right now and return the result like
        ``decompress`` would: the per-step entry point of graph front ends. Every rank must call
        it for the same keys in the same order (the TensorFlow adapter chains its ops so)."""
        from hvdcomp.frontends import numpy as np_adapter
        with self._lock:
            entry = Entry(key, array, np_adapter, self.working_dtype)
            self._process([entry])
            flat, _ = self._results.pop(entry.ticket)
        factor = self._reduction_factor(float(np.asarray(reduced_placeholder).reshape(-1)[0]), key)
        out = xp.to_host(flat) * factor if factor != 1 else xp.to_host(flat)
        return np.asarray(out, dtype=array.dtype).reshape(array.shape)

    # -- LayerFusion ---------------------------------------------------------------------------
    @property
    def fusion_plan(self):
        """The LayerFusion plan in use (dict: 'buckets' (lists of tensor names, in processing
        order), 'bytes', 'rule', 'estimate', 'latency', 'bandwidth'), or None (no plan yet, or
        ``fusion='step'``)."""
        plan = self._fusion.plan if self._fusion is not None else None
        return None if plan is None else plan.as_dict()

    @default_instance
    def describe_fusion(self):
        """One line describing the buckets in use (on a bare class: its default instance's)."""
        if self._fusion is None:
            return f"{self.method}: fusion='step' (one batch per step)"
        if self._fusion.plan is None:
            return f"{self.method}: fusion='{self._fusion.mode}', no plan yet (first step: one batch)"
        return f"{self.method}: {self._fusion.plan.describe()}"

    def _flush(self):
        entries, self._pending = self._pending, []
        if self._fusion is not None:
            self._fusion.finish_step(entries)
            return
        self._process(sorted(entries, key=lambda e: e.key))

    def _keyed(self, key):
        """``key`` (a tuple of ints keying one of the method's random streams, e.g. (seed, step,
        rank, chunk)) extended by the batch index within the step when it is > 0, so that the
        LayerFusion buckets of one step draw independent randomness while one-batch steps keep
        their keys."""
        return tuple(key) + ((self._batch,) if self._batch else ())

    def _end_step(self, batch_stats):
        """End a step reduced in one or several batches: one step count, one ``last_stats``."""
        self._batch = 0
        self._step += 1
        step = StepStats(steps=1, step=self._step, ranks=self._context().size)
        for s in batch_stats:
            step.add(s)
        step.steps, step.step = 1, self._step
        self.last_stats = step
        self.total_stats.add(step)

    def _zeros_for(self, e):
        """Zeros shaped like ``e``'s result (for a skipped step)."""
        done = self._results.get(e.ticket)
        like = done[0] if done is not None else e.work
        return xp.zeros_like(like) if like is not None else None

    def _process(self, entries, end_step=True):
        """Reduce ``entries`` (sorted identically on every rank) and store their results. With
        ``end_step=False`` (one bucket of a step) the step is not counted and a batch to skip
        raises ``bucketing.SkipStep``; returns the batch's ``StepStats``."""
        ctx = self._context()
        before = ctx.stats.snapshot()
        self._phases = {}
        t0 = time.perf_counter()
        self._check_agreement(ctx, entries)
        for e in entries:
            # Decided before the finite check, from what every rank agrees on, so that every
            # rank splits the batch alike (a NaN on one rank must not change its split).
            e.dense = e.status != OK or e.numel < self.min_compress_numel
            if e.status == OK and not xp.all_finite(e.work):
                e.status = NONFINITE
        with self._phase("encode"):
            if self.precondition:
                self._precondition_in([e for e in entries if e.work is not None])
            big = [e for e in entries if not e.dense]
            small = [e for e in entries if e.dense]
            scalars = np.asarray(self._prepare(big) if big else np.zeros((0, self.n_scalars)),
                                 dtype=np.float64).reshape(len(big), self.n_scalars)
        local = np.concatenate([[e.status for e in entries], scalars.reshape(-1)])
        gathered = ctx.allgather_array(local)
        statuses = gathered[:, :len(entries)].astype(np.int64)
        if self._bad_batch(ctx, entries, statuses):
            if not end_step:
                raise bucketing.SkipStep()
            outputs = [xp.zeros_like(e.work) if e.work is not None else None for e in entries]
            self._skipped += 1
        else:
            all_scalars = gathered[:, len(entries):].reshape(ctx.size, len(big), self.n_scalars)
            reduced = dict(zip((e.key for e in big), self._reduce(big, all_scalars) if big else []))
            reduced.update(zip((e.key for e in small), self._reduce_dense(ctx, small)))
            if self.adam is not None:
                with self._phase("decode"):
                    self._adam_out(entries, reduced)
            outputs = [reduced[e.key] for e in entries]
            for e in entries:
                if e.pre_state is not None:
                    self._memory[self._pre_key(e.key)] = e.pre_state
        for e, out in zip(entries, outputs):
            self._results[e.ticket] = (out, e)
            e.work = e.scratch = e.pre_state = None
        moved = ctx.stats.since(before)
        stats = StepStats.of_step(
            step=self._step + 1, ranks=ctx.size, elements=sum(e.numel for e in entries),
            compressed_elements=sum(e.numel for e in big), bytes_sent=moved.bytes_sent,
            bytes_recv=moved.bytes_recv, seconds=time.perf_counter() - t0, phases=self._phases)
        if end_step:
            self._end_step([stats])
        else:
            self._batch += 1
        return stats

    def _pre_key(self, key):
        """Where the preconditioner keeps a tensor's state: ``<key>#rms`` holds (t, v) for 'rms',
        ``<key>#adam`` holds (t, m, v) for 'adam'."""
        return f"{key}#{self.precondition}"

    def _precondition_in(self, entries):
        """Replace each finite entry's working gradient by what its preconditioner sends.
        'rms': the normalised gradient (``hvdcomp.algorithms.precondition``), whose new (t, v) is
        kept on the entry and stored only when the step lands (a skipped or rolled-back step
        leaves the state as it was). 'adam': the gradient in a warm-up step (reduced densely),
        else the rank's momentum (``hvdcomp.algorithms.adam``); its state is updated after the
        reduction, by ``_adam_out``."""
        for e in entries:
            state = self.memory_like(self._pre_key(e.key), e.work)
            if self.adam is not None:  # warm-up or not: the same on every rank (t is shared)
                e.dense = e.dense or adam.is_dense(state, self.adam)
            if e.status != OK:  # non-finite: the batch raises or is skipped after the gather
                continue
            if self.adam is None:
                e.work, e.pre_state = rms.step(state, e.work)
            else:
                e.work = adam.message(state, e.work, self.adam)

    def _adam_out(self, entries, reduced):
        """precondition='adam': replace each entry's mean message in ``reduced`` (key -> array)
        by Adam's step direction; the new (t, m, v) is kept on the entry until the step lands."""
        for e in entries:
            if e.status == OK:
                state = self.memory_like(self._pre_key(e.key), reduced[e.key])
                reduced[e.key], e.pre_state = adam.update(state, reduced[e.key], e.dense,
                                                          self.adam)

    def _check_agreement(self, ctx, entries):
        header = np.asarray([len(entries)] + fingerprint(entries), dtype=np.float64)
        rows = ctx.allgather_array(header)
        if (rows == rows[0]).all():
            return
        lists = ctx.allgather_object([(e.key, e.numel, tuple(e.shape), e.dtype_name)
                                      for e in entries])
        per_key = {}
        for r, items in enumerate(lists):
            for key, numel, shape, dtype in items:
                per_key.setdefault(key, {})[r] = (numel, tuple(shape), dtype)
        problems = []
        for key in sorted(per_key):
            seen = per_key[key]
            missing = [r for r in range(ctx.size) if r not in seen]
            if missing:
                problems.append(f"{key!r} is missing on rank(s) {missing}")
            elif len(set(seen.values())) > 1:
                desc = ", ".join(f"rank {r}: {n} elements, shape {list(s)}, {d}"
                                 for r, (n, s, d) in sorted(seen.items()))
                problems.append(f"{key!r} differs between ranks ({desc})")
        counts = ", ".join(f"rank {r}: {len(items)}" for r, items in enumerate(lists))
        raise RankMismatchError(
            f"{self.method}: ranks disagree about the gradients of step {self._step} "
            f"(tensors per rank: {counts}): " + "; ".join(problems[:10]))

    def _bad_batch(self, ctx, entries, statuses):
        """Raise for unsupported dtypes or (by default) non-finite values; True means skip."""
        bad = np.argwhere(statuses == UNSUPPORTED)
        if bad.size:
            r, i = bad[0]
            raise UnsupportedTensorError(
                f"{self.method}: tensor {entries[i].key!r} on rank {r} has dtype "
                f"{entries[i].dtype_name} (or is sparse); hvdcomp compresses dense floating-point "
                "gradients only (float16, bfloat16, float32, float64)")
        bad = np.argwhere(statuses == NONFINITE)
        if not bad.size:
            return False
        where = ", ".join(f"{entries[i].key!r} on rank {r}" for r, i in bad[:8])
        if self.on_nonfinite == "skip":
            return True
        raise NonFiniteGradientError(
            f"{self.method}: NaN or Inf in gradient {where} at step {self._step}; nothing was "
            "applied and the compressor state is unchanged (pass on_nonfinite='skip' to skip "
            "such steps with zero gradients instead)")

    def _reduce_dense(self, ctx, entries):
        """Mean over ranks of small tensors, fused and summed uncompressed (float32, or float64
        when any of them is float64)."""
        if not entries:
            return []
        wide = any("float64" in e.dtype_name for e in entries)
        host = [np.asarray(xp.to_host(e.work), dtype=np.float64 if wide else np.float32)
                for e in entries]
        with self._phase("comm"):
            buf = ring_allreduce(ctx, np.concatenate(host))
        buf /= ctx.size
        out, off = [], 0
        for e in entries:
            out.append(xp.from_host(buf[off:off + e.numel], e.work))
            off += e.numel
        return out


class _Phase:
    """Adds the wall time of a ``with`` block to ``phases[name]``."""

    def __init__(self, phases, name):
        self.phases, self.name = phases, name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.phases[self.name] = self.phases.get(self.name, 0.0) + time.perf_counter() - self.t0
