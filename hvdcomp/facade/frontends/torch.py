"""PyTorch adapter. CUDA gradients stay on their device: the backend's Torch kernels encode and
decode there, and only packed messages are staged through host memory for MPI. CPU gradients are
handed to the backend as NumPy views (zero-copy): the backend then runs NumPy's kernels, the same
ones the TensorFlow front end uses, which on large CPU buffers are several times faster than
Torch's (NumPy backs large allocations with transparent huge pages; a fresh 100 MB Torch tensor
costs ~45 ms of page faults, measured in ``benchmarks/kernels.py``)."""
import atexit
import sys
import threading
import weakref

import numpy as np
import torch

from hvdcomp import checks, comm, kernels, loss_scale
from hvdcomp.backend import xp
from hvdcomp.facade.frontends.identity import Identity
from hvdcomp.facade.frontends.naming import Caller, code_of, find, group_member, position, unnamed

loss_scale.watch_grad_scalers(scan=True)  # AMP's GradScaler: each step's loss scale

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Eager: compress() records the tensor for this step's batch (TensorFlow's adapter defers).
DEFERRED = False

# How far above compress() the Horovod caller may be: a comprehension's frame (Python <= 3.11)
# and a user's wrapper around the compressor fit.
FRAMES = 6
_CALLERS = None
_BY_CODE = {}  # the rows of callers() by the code object each matches (tensor_identity)


def callers():
    """The table of horovod.torch (0.28.1) functions that call ``compress()``, and the locals
    each row reads (``hvdcomp.facade.frontends.naming``). Only ``allreduce`` and
    ``grouped_allreduce`` take ``compression=`` among the direct calls (``allreduce_async``, ``allreduce_``,
    ``grouped_allreduce_async`` ... take none, so they never reach a compressor)."""
    global _CALLERS
    if _CALLERS is None:
        try:
            from horovod.torch import mpi_ops
            from horovod.torch.optimizer import _DistributedAdasumOptimizer as Adasum
            from horovod.torch.optimizer import _DistributedOptimizer as Opt
        except ImportError:  # no Horovod: nothing can name a tensor
            return ()
        from hvdcomp.facade import horovod_version
        horovod_version.check_installed()
        _CALLERS = (
            Caller("horovod.torch.optimizer._DistributedOptimizer._allreduce_grad_async",
                   "tensor (p.grad, or its dense copy), p (the parameter), name "
                   "(self._parameter_names[p]), self (the optimizer; self.process_set)",
                   code_of(Opt._allreduce_grad_async), _optimizer_one),
            Caller("horovod.torch.optimizer._DistributedOptimizer._grouped_allreduce_grad_async"
                   " (num_groups= / groups=)",
                   "ps (the group's parameters: the tensor is p.grad of one), self "
                   "(self._parameter_names[p], self.process_set)",
                   code_of(Opt._grouped_allreduce_grad_async), _optimizer_group),
            Caller("horovod.torch.optimizer._DistributedAdasumOptimizer._allreduce_grad_async",
                   "p (the tensor itself: Adasum compresses the parameter's delta), name, self",
                   code_of(Adasum._allreduce_grad_async), _optimizer_adasum),
            Caller("horovod.torch.mpi_ops.allreduce (hvd.allreduce)",
                   "tensor, name (None: unnamed), process_set",
                   code_of(mpi_ops.allreduce), _direct),
            Caller("horovod.torch.mpi_ops.grouped_allreduce (hvd.grouped_allreduce)",
                   "tensors, name (member i is named '<name>_<i+1>of<n>', as Horovod names it), "
                   "process_set", code_of(mpi_ops.grouped_allreduce), _direct_group),
        )
        _BY_CODE.update((row.matches.code, row) for row in _CALLERS)
    return _CALLERS


def _optimizer_one(frame, tensor):
    loc = frame.f_locals
    opt, name = loc.get("self"), loc.get("name")
    if loc.get("tensor") is not tensor or not isinstance(name, str):
        return None
    return Identity(name, loc.get("p"), getattr(opt, "process_set", None), opt)


def _optimizer_group(frame, tensor):
    loc = frame.f_locals
    opt = loc.get("self")
    for p in loc.get("ps") or ():
        if p.grad is tensor:
            name = opt._parameter_names.get(p)
            return Identity(name, p, opt.process_set, opt) if isinstance(name, str) else None
    return None


def _optimizer_adasum(frame, tensor):
    loc = frame.f_locals
    name = loc.get("name")
    if loc.get("p") is not tensor or not isinstance(name, str):
        return None
    return Identity(name, tensor, None, loc.get("self"))


def _direct(frame, tensor):
    loc = frame.f_locals
    name = loc.get("name")
    if loc.get("tensor") is not tensor or not isinstance(name, str):
        return None
    return Identity(name, None, loc.get("process_set"), None)


def _direct_group(frame, tensor):
    loc = frame.f_locals
    tensors, name = loc.get("tensors") or (), loc.get("name")
    index = position(tensors, tensor)
    if index is None or not isinstance(name, str):
        return None
    return Identity(group_member(name, index, len(tensors)), None, loc.get("process_set"), None)


def tensor_identity(tensor, method):
    """The ``Identity`` of ``tensor`` as the horovod.torch call that passed it to compressor
    ``method``'s ``compress()`` knows it (``callers()``); ``UnnamedTensorError`` if none does."""
    frame = sys._getframe(2)  # compress()'s caller: usually a row's function itself
    row = _BY_CODE.get(frame.f_code)  # filled by callers(), which find() calls
    identity = row.read(frame, tensor) if row is not None else None
    if identity is None:
        identity = find(tensor, callers(), frame, FRAMES)
    if identity is None:
        raise unnamed(method, tuple(tensor.shape), describe_dtype(tensor))
    return identity


def parameter_names(optimizer):
    """The sorted names of the parameters a horovod.torch DistributedOptimizer reduces."""
    names = getattr(optimizer, "_parameter_names", {})
    return sorted(names.get(p, "?") for p in getattr(optimizer, "_requires_update", ()))


def optimizer_kind(optimizer):
    """None where ``optimizer`` (a Horovod ``DistributedOptimizer``, a subclass of the user's
    optimizer class) is plain SGD without momentum, or a class outside ``torch.optim`` that
    cannot be told; else its description, e.g. ``'torch.optim.AdamW'`` or ``'torch.optim.SGD
    with momentum=0.9'`` (``hvdcomp.checks.inner_optimizer``)."""
    base = next((c for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim.")
                 and c is not torch.optim.Optimizer), None)
    if base is None:
        return None
    name = f"torch.optim.{base.__name__}"
    if not issubclass(base, torch.optim.SGD):
        return name
    momentum = sgd_momentum(optimizer)
    return None if momentum == 0.0 else f"{name} with momentum={momentum:g}"


def optimizer_steps(optimizer):
    """How many steps ``optimizer`` has trained before: where some per-parameter state it keeps
    (Adam's moments, SGD's momentum buffers) is not zero, Adam's ``state['step']`` (the
    largest) or 1; else 0, also after Horovod's ``broadcast_optimizer_state`` has made a new
    optimizer's state with a zero gradient (``hvdcomp.checks.resumed_without_state``)."""
    trained, steps = False, 1
    for state in getattr(optimizer, "state", {}).values():
        for key, value in state.items():
            if key == "step":
                steps = max(steps, int(value))
            elif (not trained and torch.is_tensor(value) and value.is_floating_point()
                  and bool(value.any())):
                trained = True
    return steps if trained else 0


def sgd_momentum(optimizer):
    """The momentum of a ``torch.optim.SGD`` (the largest of its groups'), or 0.0 for any other
    optimizer."""
    if not isinstance(optimizer, torch.optim.SGD):
        return 0.0
    return max(float(g.get("momentum", 0.0)) for g in optimizer.param_groups)


class AdamMoments:
    """The moments a user's ``torch.optim.Adam``/``AdamW`` keeps for one parameter (its
    ``optimizer.state[p]``, filled by the optimizer's first step), as
    ``hvdcomp.preconditioning.FollowAdam`` and ``ThroughAdam`` read and drive them."""
    __slots__ = ("state", "beta1", "beta2", "param", "optimizer")

    def __init__(self, state, betas, param=None, optimizer=None):
        self.state, self.beta1, self.beta2 = state, float(betas[0]), float(betas[1])
        self.param, self.optimizer = param, optimizer

    def started(self):
        """Whether the optimizer has created its state (at its first step)."""
        return "exp_avg" in self.state

    def steps(self):
        """The steps the optimizer has taken on the parameter (the same on every rank)."""
        step = self.state.get("step")
        return 0 if step is None else int(step)

    def exp_avg(self, like):
        """The first moment, flat, as the kind of array ``like`` is (a NumPy view on the CPU)."""
        flat = self.state["exp_avg"].detach().reshape(-1)
        if flat.dtype != torch.float32:  # the working arrays are float32
            flat = flat.float()
        return flat.numpy() if isinstance(like, np.ndarray) else flat

    def set_exp_avg(self, momentum):
        """Make ``momentum`` (flat, NumPy or a tensor) the first moment."""
        _copy_flat(self.state["exp_avg"], momentum)

    def set_exp_avg_sq(self, second):
        """Make ``second`` (flat, NumPy or a tensor) the second moment."""
        _copy_flat(self.state["exp_avg_sq"], second)

    def follow_gradient(self):
        """Make the gradient the optimizer's coming ``step()`` reads (``p.grad`` then) the first
        moment, just before that step: the momentum ``set_exp_avg`` landed at ``synchronize()``
        was handed over as the gradient, and a user may change it before stepping (clipping by
        norm or value, scaling, zeroing: Horovod's ``synchronize()`` / ``skip_synchronize()``
        recipe). Adam's update is then ``m / sqrt(v)`` of the gradient it received, within Adam's
        bound, as uncompressed. Forgotten at the next step's first gradient (``adam_moments``)
        or after the optimizer's step."""
        if self.param is None or self.optimizer is None:
            return
        following = _FOLLOWING.get(self.optimizer)
        if following is None:
            following = _FOLLOWING[self.optimizer] = {}
            _watch_steps(self.optimizer)
        following[id(self.param)] = self


def _watch_steps(optimizer):
    """Hooks on ``optimizer``'s ``step()`` for ``AdamMoments.follow_gradient``. torch runs them
    around Horovod's ``step()`` (whose ``synchronize()`` lands the momenta) and, where the
    user's Adam class is hooked too (any Adam created before), around Adam's own step inside
    it: the last pre-hook before Adam's update sees the gradient Adam reads."""
    def before(opt, args, kwargs):
        for moments in _FOLLOWING.get(opt, {}).values():
            grad = moments.param.grad
            if grad is not None and moments.started() and not grad.is_sparse:
                moments.state["exp_avg"].copy_(grad.detach())

    def after(opt, args, kwargs):
        _FOLLOWING.get(opt, {}).clear()

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)


_FOLLOWING = weakref.WeakKeyDictionary()  # optimizer -> {id(parameter): its AdamMoments}


def _copy_flat(moment, values):
    moment.view(-1).copy_(torch.as_tensor(values).to(moment.device, moment.dtype))


def adam_moments(identity):
    """``AdamMoments`` of the parameter whose gradient ``identity`` names, where its Horovod
    ``DistributedOptimizer`` wraps ``torch.optim.Adam`` or ``AdamW`` (without ``amsgrad`` or
    ``maximize``, whose updates differ); else None."""
    opt = identity.optimizer if identity is not None else None
    if opt is None or identity.owner is None or not isinstance(opt, _ADAM_CLASSES):
        return None
    groups = _GROUPS.get(opt)
    if groups is None or id(identity.owner) not in groups:
        groups = _GROUPS[opt] = {id(p): g for g in opt.param_groups for p in g["params"]}
    group = groups.get(id(identity.owner))
    if group is None or group.get("amsgrad") or group.get("maximize"):
        return None
    following = _FOLLOWING.get(opt)
    if following:  # a new step's gradient: the last step's are not followed any more
        following.clear()
    return AdamMoments(opt.state[identity.owner], group["betas"], identity.owner, opt)


def drivable_adam(optimizer):
    """Whether ``optimizer`` is ``torch.optim.Adam``/``AdamW`` whose moments hvdcomp can set
    (``hvdcomp.preconditioning.ThroughAdam``): no group with ``amsgrad``, ``maximize`` or
    ``beta2 = 0``."""
    return isinstance(optimizer, _ADAM_CLASSES) and not any(
        g.get("amsgrad") or g.get("maximize") or float(g["betas"][1]) == 0.0
        for g in optimizer.param_groups)


_ADAM_CLASSES = (torch.optim.Adam, torch.optim.AdamW)
_GROUPS = weakref.WeakKeyDictionary()  # optimizer -> {id(parameter): its param group}


def install_join():
    """Wrap ``hvd.join`` (horovod.torch's, idempotent) so that a rank entering it meets the ranks
    still training in hvdcomp's next step and both raise ``JoinError``
    (``hvdcomp.checks.announce_join``), instead of those ranks waiting forever in hvdcomp's
    collectives while this one waits in Horovod's join. Horovod's join runs meanwhile in a
    thread (the ranks still training need it to finish their Horovod allreduces) and is
    returned when every rank joined. A rank on which hvdcomp never communicated joins as
    before (creating hvdcomp's communicator here is a collective the others are not in)."""
    try:
        import horovod.torch as hvd_torch
        from horovod.torch import mpi_ops
    except ImportError:
        return
    original = mpi_ops.join
    if getattr(original, "hvdcomp_wrapped", False):
        return

    def join(device=-1):
        ctx = comm.existing_context()
        if ctx is None:
            return original(device)
        done = []

        def horovod_join():
            try:
                done.append((original(device), None))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                done.append((None, exc))

        thread = threading.Thread(target=horovod_join, name="hvdcomp-join", daemon=True)
        thread.start()
        _await_at_exit(thread)
        checks.announce_join(ctx)
        thread.join()
        last, exc = done[0]
        if exc is not None:
            raise exc
        return last

    join.__doc__, join.__wrapped__, join.hvdcomp_wrapped = original.__doc__, original, True
    mpi_ops.join = hvd_torch.join = join


def _await_at_exit(thread, seconds=30):
    """Give a Horovod join still running in ``thread`` (its rank raised ``JoinError`` and went
    on) up to ``seconds`` at interpreter exit to end: a daemon thread that is still inside
    Horovod's C++ wait when Python finalises is unwound by force, which aborts the process."""
    if not _JOINS:
        atexit.register(lambda: [t.join(seconds) for t in _JOINS])
    _JOINS.append(thread)


_JOINS = []  # the threads of hvd.join calls (install_join)


_DTYPE_NAMES = {}


def describe_dtype(tensor):
    key = (tensor.dtype, tensor.is_sparse)
    name = _DTYPE_NAMES.get(key)
    if name is None:
        name = str(tensor.dtype).replace("torch.", "")
        name = _DTYPE_NAMES[key] = f"sparse {name}" if tensor.is_sparse else name
    return name


def is_supported(tensor):
    return tensor.dtype in FLOAT_DTYPES and not tensor.is_sparse


_NUMPY_VIEWABLE = {"float32": torch.float32, "float64": torch.float64}


def working(tensor, dtype):
    """A flat ``dtype`` ('float32'/'float64') view or copy of ``tensor``: a NumPy array for a CPU
    tensor, a tensor on its own device otherwise."""
    if tensor.is_cpu and tensor.dtype == _NUMPY_VIEWABLE.get(dtype) and not tensor.requires_grad:
        return tensor.numpy().reshape(-1)  # the same view, in a third of the calls
    flat = tensor.detach().reshape(-1)
    if flat.dtype != getattr(torch, dtype):
        flat = flat.to(getattr(torch, dtype))
    return flat.numpy() if flat.device.type == "cpu" else flat


def result_target(tensor, identity):
    """A flat NumPy view of ``tensor`` that its reduced value may be written into, or None:
    only the gradient a Horovod ``DistributedOptimizer`` hands over (``p.grad`` itself, dense,
    contiguous, float32, on the CPU), which Horovod's own allreduce would overwrite in place too
    (``allreduce_async_``) and whose ``p.grad.set_(decompress(...))`` then keeps it; never a
    direct ``hvd.allreduce`` input (out of place) or Adasum's parameter."""
    owner = identity.owner if identity is not None and identity.optimizer is not None else None
    if (owner is not None and owner is not tensor and getattr(owner, "grad", None) is tensor
            and tensor.dtype == torch.float32 and tensor.is_cpu and not tensor.is_sparse
            and tensor.is_contiguous() and not tensor.requires_grad):
        return tensor.numpy().reshape(-1)
    return None


def placeholder(tensor, values):
    """What goes through Horovod's allreduce instead of the gradient: ``values``
    (``hvdcomp.checks.placeholder_values``), whose reduced value tells decompress() the reduction
    op. Always float32: Horovod's allreduce takes no bf16, bool or integer placeholders we would
    want. (A copy of a cached tensor: Horovod reduces it in place.)"""
    key = (tuple(values), tensor.device)
    template = _PLACEHOLDERS.get(key)
    if template is None:
        template = _PLACEHOLDERS[key] = torch.tensor(values, dtype=torch.float32,
                                                     device=tensor.device)
    return template.clone()


_PLACEHOLDERS = {}
_SUMMED_DTYPES = (torch.float32, torch.float64)


def horovod_may_sum(tensor, identity):
    """Whether Horovod's own allreduce may reduce ``tensor`` itself, with hvdcomp only checking
    it (``hvdcomp.engine.Entry.by_horovod``): a dense float32/float64 gradient from a Horovod
    ``DistributedOptimizer`` whose op is Average or Sum (pre/postscale factors are applied by
    Horovod to the tensor, so the result needs nothing from hvdcomp)."""
    return (tensor.dtype in _SUMMED_DTYPES and not tensor.is_sparse
            and getattr(identity.optimizer, "op", None) in _mean_or_sum())


def halved(tensor):
    """``tensor`` as Horovod's ``Compression.fp16`` sends a float32 gradient (float16), or None
    for another dtype (sent as it is)."""
    return tensor.to(torch.float16) if tensor.dtype == torch.float32 else None


def as_dtype(tensor, dtype):
    """``tensor`` in ``dtype`` (itself where it has it): Horovod's float16 sum of ``halved``
    gradients back in their dtype."""
    return tensor.to(dtype)


def all_finite(tensor):
    """Whether no element of ``tensor`` is NaN or +-Inf. A dense contiguous CPU float32/float64
    tensor is read in place by its address where numba is installed (``hvdcomp.kernels.finite``:
    ~3 us inside a training step, where a NumPy view and a dot product cost ~10 us; this is the
    check of every small tensor Horovod sums, ``hvdcomp.engine.Entry.by_horovod``, once per tensor
    per step; from when the step engine has loaded it, ``hvdcomp.kernels.ready``); any other
    through ``hvdcomp.backend.xp.all_finite`` (the same verdict)."""
    at = _FINITE_AT[0] if _FINITE_AT else _finite_at()
    if (at is not None and tensor.is_cpu and tensor.dtype in _SUMMED_DTYPES
            and not tensor.is_sparse and tensor.is_contiguous()):
        return at(tensor.data_ptr(), tensor.numel(), tensor.element_size())
    return xp.all_finite(tensor)


def _finite_at():
    """The kernel once it is loaded (kept from then on), else None."""
    if kernels.ready("finite"):
        from hvdcomp.kernels.finite import all_finite_at
        _FINITE_AT.append(all_finite_at)
        return all_finite_at
    return None


_FINITE_AT = []  # [hvdcomp.kernels.finite.all_finite_at] once the engine has loaded it


def _mean_or_sum():
    if not _MEAN_OR_SUM:
        from horovod.torch.mpi_ops import Average, Sum
        _MEAN_OR_SUM.extend((Average, Sum))
    return _MEAN_OR_SUM


_MEAN_OR_SUM = []


def reduced(output):
    """The reduced placeholder's values, as floats (the placeholder is 1-D)."""
    return output.tolist()


def restore(flat, like_shape, like_dtype, like_device):
    """``flat`` (a backend result: NumPy array or tensor) as a tensor of the original shape, dtype
    and device."""
    if isinstance(flat, np.ndarray):
        flat = torch.from_numpy(flat)
    flat = flat.reshape(like_shape)
    if flat.dtype != like_dtype or flat.device != like_device:
        flat = flat.to(device=like_device, dtype=like_dtype)
    return flat


def meta(tensor):
    """(shape, dtype, device) to rebuild the result."""
    return tuple(tensor.shape), tensor.dtype, tensor.device


install_join()
