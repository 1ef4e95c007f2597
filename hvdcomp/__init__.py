"""hvdcomp: gradient compression for Horovod.

Change one argument of a stock Horovod script::

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvdcomp.Marsit)

Each public compressor works passed bare (the class: one shared default instance) or configured
(``hvdcomp.Marsit(seed=1)``: an instance with its own state). See README.md and docs/.
"""
import sys as _sys

from hvdcomp import loss_scale as _loss_scale
from hvdcomp import registry as _registry
from hvdcomp.algorithms.adam import AdamSettings
from hvdcomp.errors import (DirectCallWarning, HvdcompError, JoinError, LaunchError,
                            NonFiniteGradientError, RankMismatchError, SetupMismatchError,
                            StateNotRestoredWarning, UnnamedTensorError, UnsupportedOpError,
                            UnsupportedOptimizerError, UnsupportedTensorError)
from hvdcomp.facade import BatchedCompressor
from hvdcomp.stats import StepStats
from hvdcomp.loss_scale import set_loss_scale

globals().update(_registry.METHODS)  # hvdcomp.Marsit, ...: the Horovod compressor of each method

if "torch" in _sys.modules:  # else at the first torch gradient (hvdcomp.facade.frontends.torch)
    _loss_scale.watch_grad_scalers()
if "horovod.torch" in _sys.modules:  # hvd.join() raises instead of hanging (ibid.)
    from hvdcomp.facade.frontends import torch as _torch_frontend  # noqa: F401

DEFAULT = _registry.METHODS["Marsit"]

__version__ = "0.2.0"
__all__ = [*_registry.METHODS, "DEFAULT", "AdamSettings", "BatchedCompressor", "StepStats",
           "set_loss_scale", "HvdcompError",
           "LaunchError", "NonFiniteGradientError", "RankMismatchError", "SetupMismatchError",
           "UnsupportedOpError", "UnsupportedTensorError", "UnnamedTensorError", "JoinError",
           "UnsupportedOptimizerError", "StateNotRestoredWarning", "DirectCallWarning"]
