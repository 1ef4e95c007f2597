"""The method contract: what a compression method is to hvdcomp, and all it may know.

A method reduces one batch of tensors to their mean over the ranks. It knows nothing of Horovod,
of the facade that users pass as ``compression=`` (``hvdcomp.facade``) or of the step engine
(``hvdcomp.engine``): everything it is given arrives in a ``Batch`` (below):

- ``batch.entries``: the tensors it compresses, sorted by name, each an ``Entry`` (below): ``work``
  (the flat working gradient, float32 or float64, on its device), ``numel``, ``shape``, ``key``
  (its name), and what the shared wrappers set (``gradient``, ``adam``, the error-compensated
  buffer of ``hvdcomp.feedback``);
- ``batch.ctx``: the communicator of its process set (``hvdcomp.comm``: rank, size, MPI
  collectives on a transport: ``hvdcomp.comm.transport``), already narrowed to a node's shard
  peers where node stages wrap it;
- ``batch.store``: its per-tensor state (``hvdcomp.state.StateStore``: ``get``, ``put`` staged
  until the step lands, ``scratch`` buffers that are not state);
- ``batch.key(...)``: the key of a random stream (seed, step, rank, chunk), the same on every
  rank that draws it;
- ``batch.phase(name)``: a timer (``'encode'``, ``'comm'``, ``'decode'``) for ``last_stats``.

It provides ``prepare(batch)`` (local work, and ``n_scalars`` floats per tensor that every rank then
receives from every other in one all-gather, which overlaps the method's collective) and
``reduce(batch, scalars)`` (the reduced step of each entry, flat, in entry order; new state staged
in the store), ``settings()`` (its own constructor arguments, which every rank must agree on and a
checkpoint records) and class attributes that tell the shared mechanisms how to wrap it (below).
``seed`` and ``preconditioner`` are common settings the runtime gives it before its first batch.
Each process set a compressor serves runs its own shallow copy of the method
(``hvdcomp.facade.runtime``): what a method derives from its set (a node layout) it assigns to its
own attributes, and it keeps no mutable container shared between copies.

What wraps a method, written once each: error feedback (``hvdcomp.feedback``, which its
``reduce`` calls to keep the residual), preconditioning (``hvdcomp.preconditioning``: what a rank
sends instead of the raw gradient), node stages (``hvdcomp.hierarchical.wrap``), the
compress-or-pass decision (``hvdcomp.decision``), checks and state (the step engine), and the
Horovod ``Compressor`` facade (``hvdcomp.facade.compressor_class``, applied by
``hvdcomp.registry``). A new method is one folder, ``hvdcomp/methods/<name>/``, with a ``Method``
subclass, plus its registry entries (docs/extending.md). ``Entry`` and ``Batch`` below are all a
method is given, so a method runs without the engine too (tests/inprocess.py drives every method
on simulated ranks).
"""
import contextlib
import math

from hvdcomp.backend import xp


class Method:
    """Base of the methods (module docstring). Class attributes:

    - ``name``: the name errors, logs and checkpoints carry (``'Marsit'``);
    - ``n_scalars``: floats per tensor ``prepare`` returns (read after ``prepare``, which may set
      it per batch, the same on every rank: BinSGDM's under Adam);
    - ``node_shares``: what node stages hand each local rank, ``'elements'`` (an element shard of
      every tensor) or ``'tensors'`` (whole tensors: a method that needs a tensor's shape);
      ``own_stages``: True where the method runs its paper's own stages (BinSGDM);
    - ``under_adam``: what it does under the user's Adam without ``precondition=``
      (``hvdcomp.preconditioning.make``);
    - ``returns_step``: the method's name where its result is the optimizer's step itself (an
      exact sum of its input is then not what the optimizer expects), else None; such a method
      passes only if it can step aside, providing ``exact_parts(work, key, store, out)``,
      and ``adam_samples(work, key, store)`` with ``adam_step(step, mean_samples, size, bound)``
      for its step under the user's Adam (``hvdcomp.stepaside``: BinSGDM);
    - ``refused``: common settings it cannot take, and ``refusal``, why; ``fixed``: common
      settings it sets itself (e.g. ``min_compress_numel=0``);
    - ``kernel_modules``: the kernel modules its host path uses (module paths, or the names of
      shared ones in ``hvdcomp.kernels``), loaded by the step
      engine where compressing pays (``hvdcomp.engine.KernelLoading``; the reference path,
      the same bits, until then).
    """

    name = "base"
    n_scalars = 0
    node_shares = "elements"
    own_stages = False
    under_adam = "momentum"
    returns_step = None
    refused, refusal, fixed = (), "", {}
    kernel_modules = ()
    seed = 0  # common settings, set by the runtime (hvdcomp.facade)
    preconditioner = None
    last_legs = None  # node stages: {'intra', 'inter'} CommStats of the last batch, if any

    def settings(self):
        """The method's own settings (a dict of plain values; constructor arguments)."""
        return {}

    def prepare(self, batch):
        """Local work before anything is communicated: float64 array-like of shape
        ``(len(batch.entries), n_scalars)``. Stages no state."""
        raise NotImplementedError

    def reduce(self, batch, scalars):
        """The mean over ranks of each entry (flat, on the entry's device), in entry order;
        ``scalars``: every rank's, shape ``(size, len(batch.entries), n_scalars)``, indexed as
        an array (a ``hvdcomp.comm.context.Gathered``: its all-gather may still be in flight,
        and the first read waits for it, so read it after the method's own collective). Stages
        the new state with ``batch.store.put`` (or ``hvdcomp.feedback.keep``)."""
        raise NotImplementedError

    def under_sgd_momentum(self, momentum):
        """Whether a ``returns_step`` method adapts to the optimizer's SGD ``momentum`` (it may
        change its own settings in use); False: such an optimizer is refused."""
        return False


class Entry:
    """One tensor as a method sees it. Given: ``key`` (its name, the same on every rank),
    ``work`` (the flat working gradient: a float32/float64 NumPy array, or a torch tensor on its
    device), ``numel``, ``shape`` (the tensor's), ``gradient`` (an optimizer's gradient, which
    the loss scale and the user's Adam concern), ``adam`` (the user's Adam moments of its
    parameter, ``hvdcomp.preconditioning``, or None) and ``into`` (a flat host array the step
    may be written into: the user's gradient, or None). Set by the shared wrappers and the
    method during the batch: ``compensated``/``owned`` (``hvdcomp.feedback``), ``moments``
    (BinSGDM's), ``own_scale`` (Marsit's). The step engine's entries extend it with what only
    the engine knows (``hvdcomp.engine.Entry``)."""
    __slots__ = ("key", "work", "numel", "shape", "gradient", "adam", "into", "compensated",
                 "owned", "moments", "own_scale")

    def __init__(self, key, work, shape=None, gradient=True, adam=None, into=None):
        self.key, self.work, self.gradient, self.adam, self.into = key, work, gradient, adam, into
        self.shape = tuple(work.shape) if shape is None else tuple(shape)
        self.numel = math.prod(self.shape)
        self.compensated = self.owned = self.moments = self.own_scale = None

    def result_buffer(self, like, done_reading=None):
        """The array to write this entry's step into, shaped and typed like ``like`` (contents:
        garbage): ``into`` (the user's gradient: no allocation) when the method reads the
        gradient no more, else a new array. ``done_reading``: whether nothing the method still
        reads is the working gradient; by default ``owned`` (the error-compensated vector the
        decode reads is a buffer of the store, ``hvdcomp.feedback``)."""
        free = self.owned if done_reading is None else done_reading
        if free and self.into is not None and self.into.dtype == like.dtype:
            return self.into
        return xp.empty_like(like)


class Batch:
    """What a method sees of one batch: ``entries`` (``Entry``, sorted by name), ``ctx`` (the
    ``CommContext``), ``store`` (the ``StateStore``), ``step`` (steps completed before this
    one), ``index`` (the batch within the step: LayerFusion buckets) and ``phase`` (a timer:
    ``with batch.phase('encode'): ...``; by default one that times nothing)."""

    def __init__(self, entries, ctx, store, step=0, index=0, phase=None):
        self.entries, self.ctx, self.store = entries, ctx, store
        self.step, self.index = step, index
        self.phase = phase if phase is not None else _untimed

    def key(self, *parts):
        """A random-stream key: ``parts`` (ints, e.g. seed, step, rank, chunk), extended by the
        batch index when it is > 0, so that the buckets of one step draw independent
        randomness while one-batch steps keep their keys."""
        return tuple(parts) + ((self.index,) if self.index else ())


def _untimed(name):
    return contextlib.nullcontext()
