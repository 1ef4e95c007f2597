"""hvdcomp: gradient compression for Horovod.

Change one argument of a stock Horovod script::

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvdcomp.Marsit)

Each public compressor works passed bare (the class: one shared default instance) or configured
(``hvdcomp.Marsit(seed=1)``: an instance with its own state). See README.md.
"""
import sys as _sys

from hvdcomp import loss_scale as _loss_scale
from hvdcomp.algorithms.adam import AdamSettings
from hvdcomp.binsgdm import BinSGDM
from hvdcomp.efsignsgd import EFSignSGD
from hvdcomp.protocol import BatchedCompressor
from hvdcomp.errors import (HvdcompError, JoinError, LaunchError, NonFiniteGradientError,
                            RankMismatchError, SetupMismatchError, UnnamedTensorError,
                            UnsupportedOpError, UnsupportedOptimizerError,
                            UnsupportedTensorError)
from hvdcomp.marsit import Marsit
from hvdcomp.powersgd import PowerSGD
from hvdcomp.sketchfusion import SketchFusion
from hvdcomp.stats import StepStats
from hvdcomp.topk import TopK
from hvdcomp.loss_scale import set_loss_scale

if "torch" in _sys.modules:  # else at the first torch gradient (hvdcomp.frontends.torch)
    _loss_scale.watch_grad_scalers()
if "horovod.torch" in _sys.modules:  # hvd.join() raises instead of hanging (ibid.)
    from hvdcomp.frontends import torch as _torch_frontend  # noqa: F401

DEFAULT = Marsit

__version__ = "0.1.0"
__all__ = ["Marsit", "BinSGDM", "TopK", "SketchFusion", "EFSignSGD", "PowerSGD", "DEFAULT",
           "AdamSettings", "BatchedCompressor", "StepStats", "set_loss_scale", "HvdcompError",
           "LaunchError", "NonFiniteGradientError", "RankMismatchError", "SetupMismatchError",
           "UnsupportedOpError", "UnsupportedTensorError", "UnnamedTensorError", "JoinError",
           "UnsupportedOptimizerError"]
