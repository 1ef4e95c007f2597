"""Every hvdcomp method as a PyTorch DDP communication hook, on torch.distributed (no MPI rank).

In PyTorch's PowerSGD hook's shape::

    state = hvdcomp.ddp.State(hvdcomp.Marsit(), process_group=None)
    ddp_model.register_comm_hook(state, hvdcomp.ddp.hook)

``hook(state, bucket) -> Future``: the Future holds one tensor of the bucket's flat shape,
dtype and device, the mean of the bucket over the group's ranks, identical on every rank.
The first ``start_iter`` iterations (2 by default: DDP rebuilds its buckets after the first)
run DDP's own all-reduce. From then on every bucket's gradients are entries of one batch per
iteration (one tensor per parameter, as Horovod's front end sees them), reduced through the
method's runtime (``hvdcomp.facade.runtime.Runtime``: its state, its compress-or-pass decision,
its checks) over the group's ``hvdcomp.comm.transport.TorchTransport`` (Gloo, buffers in host
memory; beside an NCCL default group, a Gloo group of the same ranks). A bucket whose every
tensor the decision passes is summed at once by torch.distributed's all-reduce, as DDP's own
hook sums it (in float16 where the decision chose it, as ``fp16_compress_hook``), while the
backward pass goes on; the compressed ones are reduced at the last bucket, as one batch sorted
by name, and then every bucket's Future completes. The batch does not depend on DDP's bucket
layout, so a resumed run repeats the uninterrupted one bit for bit (DDP's own all-reduce does
not, in the first iteration of a new DDP model, whose layout differs).
The method, its options, the loss scale of ``torch.amp.GradScaler`` (``hvdcomp.loss_scale``),
the checks that raise on every rank (settings that differ, non-finite gradients per
``on_nonfinite``) are as for Horovod, and so is the user's ``torch.optim.Adam``/``AdamW``: the
first optimizer to step over the model's parameters (seen by a global step pre-hook of
torch.optim, removed then) is the one whose moments hvdcomp follows where it is Adam
(``hvdcomp.preconditioning.FollowAdam``: each rank sends its momentum, Adam takes the mean one;
clipping between ``backward()`` and ``step()`` acts on what Adam then reads).

State for checkpoints: ``state.state_dict()`` / ``state.load_state_dict(d)`` (tensors and plain
values only: ``torch.load(weights_only=True)`` reads it), and ``pickle`` (as ``PowerSGDState``:
the process group is not pickled; an unpickled state reduces over the default group).
"""
import numpy as np

from hvdcomp import loss_scale, registry
from hvdcomp.comm.transport import torch_context
from hvdcomp.engine import Entry
from hvdcomp.errors import HvdcompError
from hvdcomp.facade import BatchedCompressor
from hvdcomp.facade.runtime import Runtime
from hvdcomp.facade.frontends import Identity, adapter_for

FORMAT = "hvdcomp-ddp-1"


class State:
    """A hook's state: ``compression`` (an hvdcomp compressor, or its class: a new instance;
    default ``hvdcomp.Marsit``), ``process_group`` (None: the default group), ``start_iter``
    (iterations of DDP's own all-reduce first, >= 1), ``optimizer`` (the optimizer of the
    model's parameters, whose Adam hvdcomp follows; None: the first to step them, seen at its
    first step: pass it where a run resumes from a checkpoint under Adam, so that the first
    iteration after the resume follows it too). ``iter`` counts the iterations begun;
    ``runtime`` is the method's ``Runtime`` over the group (made at the first compressed step);
    ``keys`` names each parameter by its place in DDP's first bucket layout."""

    def __init__(self, compression=None, process_group=None, start_iter=2, optimizer=None):
        compression = registry.METHODS["Marsit"] if compression is None else compression
        if isinstance(compression, type):
            compression = compression()
        if not isinstance(compression, BatchedCompressor):
            raise TypeError(f"hvdcomp.ddp.State takes an hvdcomp compressor or its class, got "
                            f"{compression!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 1:
            raise ValueError(f"start_iter must be an int >= 1, got {start_iter!r}")
        self.compressor, self.process_group = compression, process_group
        self.start_iter, self.iter = start_iter, 0
        self.runtime = None
        from torch.utils.weak import WeakIdKeyDictionary
        self.keys = WeakIdKeyDictionary()  # parameter -> its tensor's name
        self.waiting = []  # this iteration's buckets: (buffer, entries, DDPSum or None, Future)
        self._restore_later = None  # an unpickled state, restored once the group exists
        self.optimizer = optimizer  # the optimizer that steps the model's parameters
        self._watching = _watch_optimizers(self) if optimizer is None else None

    def bind(self):
        """The runtime (made on first use, over the group's torch.distributed transport)."""
        if self.runtime is None:
            self.runtime = Runtime(self.compressor, None,
                                   torch_context(gloo_group(self.process_group)))
        if self._restore_later is not None:
            saved, self._restore_later = self._restore_later, None
            self.load_state_dict(saved)
        return self.runtime

    def names(self, bucket):
        """The names of ``bucket``'s gradients: ``b<index>.<position>`` in the bucket where DDP
        first put the parameter (the layout of a new DDP model's first iteration: the same
        before and after a resume, while DDP's later layout may differ in that iteration)."""
        index = bucket.index()
        for j, p in enumerate(bucket.parameters()):
            if p not in self.keys:
                self.keys[p] = f"b{index:04d}.{j:05d}"
        return [self.keys[p] for p in bucket.parameters()]

    def arrived(self, bucket):
        """Take ``bucket`` (after ``start_iter``): its entries are made now (a gradient the
        decision passes is read for the checks before anything sums it) and, where the decision
        passes every tensor of the bucket, its all-reduce starts now, while the backward pass
        goes on (``DDPSum``); the step is reduced at the last bucket. Returns its Future."""
        import torch
        if self._watching is not None and self.optimizer is not None:
            self._watching.remove()
            self._watching = None
        rt, names, buffer = self.bind(), self.names(bucket), bucket.buffer()
        gradients = bucket.gradients()
        passed = all(rt.hands_to_horovod(g.numel(), n, lambda: False)
                     for n, g in zip(names, gradients))
        identities = [Identity(n, p, optimizer=self.optimizer)
                      for n, p in zip(names, bucket.parameters())]
        entries = [rt.engine.entry(n, g, adapter_for(g), by_horovod=True, identity=i) if passed
                   else Entry(n, g, adapter_for(g), identity=i, gradient=True)
                   for n, g, i in zip(names, gradients, identities)]
        summing = DDPSum(buffer, self.process_group, rt.decision.passes_half()
                         and loss_scale.current() == 1.0) if passed else None
        fut = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        self.waiting.append((buffer, entries, summing, fut))
        return fut

    def reduce_step(self):
        """At the last bucket: every bucket's entries reduced as one batch sorted by name (so
        the batch does not depend on DDP's bucket layout), the means written into each
        compressed bucket's buffer, the sums of the passed ones awaited, every Future
        completed."""
        waiting, self.waiting = self.waiting, []
        rt = self.bind()
        entries = sorted((e for _, bucket_entries, _, _ in waiting for e in bucket_entries),
                         key=lambda e: e.key)
        try:
            for _, _, summing, _ in waiting:
                if summing is not None:
                    summing.wait()
            rt.engine.process(entries)
            results = {e.key: rt.engine.take(e.ticket) for e in entries}
        except BaseException as exc:
            for *_, fut in waiting:
                fut.set_exception(exc)
            raise
        for buffer, bucket_entries, _, fut in waiting:
            offset = 0
            for e in bucket_entries:
                flat, _ = results[e.key]
                part = buffer[offset:offset + e.numel]
                if not e.by_horovod:
                    part.copy_(e.restore(flat).reshape(-1))
                elif flat.fill is not None:  # a skipped step
                    part.fill_(flat.fill)
                offset += e.numel
            fut.set_result(buffer)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self):
        """This rank's state: the iteration and the runtime's ``Runtime.state_dict``, as
        tensors and plain values."""
        saved = {"format": FORMAT, "method": self.compressor.method, "iter": self.iter,
                 "start_iter": self.start_iter}
        if self.runtime is not None:
            saved["runtime"] = _as_torch(self.runtime.state_dict(False))
        elif self._restore_later is not None:
            saved["runtime"] = self._restore_later.get("runtime")
        return saved

    def load_state_dict(self, checkpoint):
        """Restore what ``state_dict`` returned, between iterations."""
        if checkpoint.get("format") != FORMAT:
            raise HvdcompError(f"hvdcomp.ddp: not a DDP hook state (format "
                               f"{checkpoint.get('format')!r})")
        if checkpoint.get("runtime") is not None:
            rt = self.bind()
            rt.restore(*rt.this_ranks(_as_numpy(checkpoint["runtime"])))
        self.iter = int(checkpoint["iter"])

    def __getstate__(self):
        return {"compression": type(self.compressor).__name__,
                "arguments": constructor_arguments(self.compressor),
                "state": self.state_dict()}

    def __setstate__(self, saved):
        compression = registry.METHODS[saved["compression"]](**saved["arguments"])
        self.__init__(compression, None, saved["state"]["start_iter"])
        self.iter = saved["state"]["iter"]
        self._restore_later = saved["state"]  # at the first hook: the group exists then


def _watch_optimizers(state):
    """A global step pre-hook of torch.optim that sets ``state.optimizer`` to the first
    optimizer stepping a parameter ``state`` has named; its handle, which ``State.arrived``
    removes then (not the hook itself: torch is iterating over the hooks)."""
    import weakref

    from torch.optim.optimizer import register_optimizer_step_pre_hook
    watched = weakref.ref(state)

    def seen(optimizer, args, kwargs):
        state = watched()
        if state is not None and state.optimizer is None and any(
                p in state.keys for g in optimizer.param_groups for p in g["params"]):
            state.optimizer = optimizer
    return register_optimizer_step_pre_hook(seen)


def hook(state, bucket):
    """The DDP communication hook (module docstring): a Future of the bucket's mean."""
    if state.iter < state.start_iter:
        state.names(bucket)  # the first layout names the parameters
        if bucket.is_last():
            state.iter += 1
        summing = DDPSum(bucket.buffer(), state.process_group, half=False)
        return summing.work.get_future().then(lambda fut: fut.value()[0])
    fut = state.arrived(bucket)
    if bucket.is_last():
        state.iter += 1
        state.reduce_step()
    return fut


class DDPSum:
    """The mean of a bucket ``buffer`` over ``group`` by torch.distributed's all-reduce, started
    now, as DDP's own hook sums it (in float16 where ``half``, as its ``fp16_compress_hook``);
    ``wait()`` leaves the mean in ``buffer``."""

    def __init__(self, buffer, group, half):
        import torch
        import torch.distributed as dist
        self.buffer = buffer
        self.sent = buffer.to(torch.float16) if half and buffer.dtype == torch.float32 else buffer
        self.sent.div_(dist.get_world_size(group))
        self.work = dist.all_reduce(self.sent, group=group, async_op=True)

    def wait(self):
        self.work.wait()
        if self.sent is not self.buffer:
            self.buffer.copy_(self.sent)


def gloo_group(group):
    """``group`` where its backend is Gloo; else (NCCL) a Gloo group of the same ranks for
    hvdcomp's host messages, made now by every rank of the default group (so ``group`` must be
    the default one)."""
    import torch.distributed as dist
    if dist.get_backend(group) == "gloo":
        return group
    if group is not None and dist.get_world_size(group) != dist.get_world_size():
        raise HvdcompError(
            "hvdcomp.ddp: a process group of a part of the ranks must use the Gloo backend "
            "(hvdcomp's messages travel in host memory); with NCCL, use the default group")
    return dist.new_group(backend="gloo")


def constructor_arguments(compressor):
    """The keyword arguments that build a compressor like ``compressor`` (its method's own
    settings and the common ones it takes)."""
    common = {"seed": compressor.algorithm.seed,
              "min_compress_numel": compressor.min_compress_numel,
              "on_nonfinite": compressor.on_nonfinite,
              "precondition": compressor.precondition_setting,
              "decision": compressor.decision_mode, "hierarchy": compressor.hierarchy_mode}
    method = type(compressor).Method
    return {**compressor.algorithm.settings(),
            **{k: v for k, v in common.items() if k not in method.refused + tuple(method.fixed)}}


def _as_torch(value):
    """``value`` with every NumPy array a torch tensor (what ``weights_only`` loads)."""
    import torch
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _as_torch(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_torch(v) for v in value)
    return value


def _as_numpy(value):
    """The inverse of ``_as_torch``."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    if isinstance(value, dict):
        return {k: _as_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_numpy(v) for v in value)
    return value
