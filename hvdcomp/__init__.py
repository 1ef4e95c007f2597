"""hvdcomp: gradient compression for Horovod.

Change one argument of a stock Horovod script::

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvdcomp.Marsit)

Each public compressor works passed bare (the class: one shared default instance) or configured
(``hvdcomp.Marsit(seed=1)``: an instance with its own state). See README.md.
"""
from hvdcomp.algorithms.adam import AdamSettings
from hvdcomp.binsgdm import BinSGDM
from hvdcomp.efsignsgd import EFSignSGD
from hvdcomp.protocol import BatchedCompressor
from hvdcomp.errors import (HvdcompError, LaunchError, NonFiniteGradientError,
                            RankMismatchError, SetupMismatchError, UnnamedTensorError,
                            UnsupportedOpError, UnsupportedTensorError)
from hvdcomp.marsit import Marsit
from hvdcomp.sketchfusion import SketchFusion
from hvdcomp.stats import StepStats
from hvdcomp.topk import TopK

DEFAULT = Marsit

__version__ = "0.1.0"
__all__ = ["Marsit", "BinSGDM", "TopK", "SketchFusion", "EFSignSGD", "DEFAULT", "AdamSettings",
           "BatchedCompressor", "StepStats", "HvdcompError", "LaunchError",
           "NonFiniteGradientError", "RankMismatchError", "SetupMismatchError",
           "UnsupportedOpError", "UnsupportedTensorError", "UnnamedTensorError"]
