"""The loss scale of the current step: what the gradients hvdcomp receives are multiplied by.

Mixed-precision training multiplies the loss by a scale ``s`` (AMP's ``GradScaler``: 65536 at
first, halved after an overflow, doubled after 2000 good steps; or a fixed scale the user picks)
and divides the reduced gradients by ``s`` before the optimizer step. Horovod's allreduce is
linear, so ``s`` cancels. hvdcomp's methods are not: their state (error-feedback memory,
BinSGDM's moments, the preconditioners' moments) would be kept in the units of the step that
wrote it and added to a step of another scale, and a method that returns a normalised step
(BinSGDM, ``precondition='rms'``/``'adam'``) would then be divided by ``s`` by the user's
unscale. So the step engine (``hvdcomp.engine``) reduces ``g / s`` (state in unscaled units) and
returns ``s`` times the result, which the user's unscale divides again: a run under any sequence
of loss scales trains as the run without scaling (bit for bit for powers of two, which is what
GradScaler uses; to float rounding otherwise).

Where ``s`` comes from, in order:

1. ``set_loss_scale(s)``: a scale the script applies itself (``(loss * s).backward()``);
   ``set_loss_scale(None)`` hands over to the next rules.
2. The ``torch.amp.GradScaler`` (``torch.cuda.amp.GradScaler`` too) whose ``scale()`` was called
   last in this process: its ``get_scale()`` (1 where it is disabled). Nothing to pass: hvdcomp
   watches ``GradScaler.scale`` from the moment torch and hvdcomp are both imported (scalers made
   before that are found once, at the first torch gradient).
3. Otherwise 1.

In TensorFlow, the user's Keras ``LossScaleOptimizer`` (``mixed_float16``) is read in the step
op itself and applies ahead of these rules (``given``).

The ranks must use the same scale in a step; the engine checks it (``hvdcomp.checks.agree``).
"""
import contextlib
import gc
import math
import sys
import weakref

_manual = None  # the scale set by set_loss_scale(), or None
_given = None  # the scale of a graph front end's step under way (given), or None
_last_scaler = None  # a weakref to the GradScaler whose scale() was called last
_watching = False


def set_loss_scale(scale):
    """Tell hvdcomp that the gradients of the following steps are multiplied by ``scale`` (a
    finite float > 0), as in ``(loss * scale).backward()``; None: back to the GradScaler seen,
    or 1. Applies to every compressor in this process, from the next step on."""
    global _manual
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"set_loss_scale: the scale must be a finite number > 0 or None, "
                             f"got {scale!r}")
        scale = float(scale)
    _manual = scale


def current():
    """The loss scale of the step about to be reduced (a float > 0; 1.0 without scaling)."""
    if _given is not None:
        return _given
    if _manual is not None:
        return _manual
    scaler = _last_scaler() if _last_scaler is not None else None
    if scaler is None or not scaler.is_enabled():
        return 1.0
    return float(scaler.get_scale())


@contextlib.contextmanager
def given(scale):
    """The loss scale of the steps reduced inside: a graph front end's, read in the step op
    from the user's Keras ``LossScaleOptimizer`` (1.0: none), ahead of the other rules."""
    global _given
    _given = None if scale == 1.0 else scale
    try:
        yield
    finally:
        _given = None


def watch_grad_scalers(scan=False):
    """Start following ``torch.amp.GradScaler.scale`` (idempotent; needs torch imported): the
    scaler whose ``scale()`` runs becomes the source of ``current()``. ``scan``: also look for a
    scaler that already scaled a loss before this among the live objects (once: when hvdcomp was
    imported before torch, this runs at the first torch gradient)."""
    global _watching, _last_scaler
    if _watching or "torch" not in sys.modules:
        return
    from torch.amp.grad_scaler import GradScaler
    _watching = True
    original = GradScaler.scale

    def scale(self, outputs):
        global _last_scaler
        _last_scaler = weakref.ref(self)
        return original(self, outputs)

    scale.__doc__, scale.__wrapped__ = original.__doc__, original
    GradScaler.scale = scale
    used = [o for o in (gc.get_objects() if scan else ())
            if issubclass(type(o), GradScaler) and getattr(o, "_scale", None) is not None]
    if used:
        _last_scaler = weakref.ref(used[-1])
