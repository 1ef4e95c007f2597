"""Errors hvdcomp raises. Every message names the tensor and the rank it concerns."""


class HvdcompError(RuntimeError):
    """Base class of hvdcomp's errors."""


class LaunchError(HvdcompError):
    """The job was not launched in a way hvdcomp can work with (e.g. no MPI ranks)."""


class RankMismatchError(HvdcompError):
    """Ranks disagree about the tensors of a step (names, shapes, dtypes or their number)."""


class NonFiniteGradientError(HvdcompError):
    """A gradient holds NaN or Inf on some rank."""


class UnsupportedTensorError(HvdcompError):
    """A tensor hvdcomp cannot compress (integer, bool or complex dtype, ...)."""


class UnsupportedOpError(HvdcompError):
    """A Horovod reduction hvdcomp does not implement (op=Min, Max, Product, Adasum)."""


class JoinError(HvdcompError):
    """A rank called ``hvd.join()`` while others still train: hvdcomp's reduction needs every
    rank in every step (raised on every rank, see ``hvdcomp.checks.announce_join``)."""


class UnsupportedOptimizerError(HvdcompError):
    """A compressor setting that cannot work with the optimizer hvdcomp finds (e.g.
    ``precondition='adam'`` or BinSGDM, which return the step itself, under SGD with momentum or
    under Adam)."""


class SetupMismatchError(RankMismatchError):
    """Ranks use different compressors or compressor settings for the same tensors."""


class UnnamedTensorError(HvdcompError):
    """A tensor reached a compressor with no name to keep its state under (e.g. hvd.allreduce
    without ``name=``): see ``hvdcomp.facade.frontends.naming``."""
    # Exception's own __init__: AutoGraph then re-raises it from inside a tf.function as this
    # class (with its "in user code" trace), not as a generic StagingError.
    __init__ = Exception.__init__


class StateNotRestoredWarning(UserWarning):
    """The user's optimizer resumes from a checkpoint while the compressor starts with empty
    state (its error memory was not saved or not restored): training goes on, on another
    trajectory than the uninterrupted run (``hvdcomp.checks.resumed_without_state``)."""


class DirectCallWarning(UserWarning):
    """A direct ``hvd.allreduce``/``grouped_allreduce`` call is compressed as a gradient (with
    error feedback): wrong for a value the user reads (``hvdcomp.checks.direct_call_compressed``)."""
