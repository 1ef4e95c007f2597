"""The one table of hvdcomp's methods and named presets.

- ``METHODS``: every public method, in order, name -> Horovod compressor class
  (``"Marsit": hvdcomp.Marsit``); hvdcomp exports each under its name.
- ``PRESETS``: named configurations, name -> ``Preset`` (class and constructor arguments).
  Every method has a *base preset*, its lower-case name with no arguments (``"efsignsgd"`` is
  ``hvdcomp.EFSignSGD()``); the others are variants (``"marsit-adam"`` is
  ``hvdcomp.Marsit(precondition="adam")``).

Adding a method: its folder in hvdcomp/methods/ (docs/extending.md), its line in ``METHODS`` and
its base preset here. The examples' learning rates per preset are in examples/recipes.py, what
the tests expect of it in tests/expect.py.

    >>> from hvdcomp import registry
    >>> comp = registry.build("marsit-adam", seed=1)  # Marsit(precondition="adam", seed=1)
"""
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from hvdcomp.facade import compressor_class
from hvdcomp.methods import binsgdm, efsignsgd, marsit, powersgd, sketchfusion, topk

# Each method's Horovod compressor (hvdcomp.facade.compressor_class), exported as hvdcomp.<name>.
METHODS = {m.name: compressor_class(m) for m in (
    marsit.Marsit, binsgdm.BinSGDM, topk.TopK, sketchfusion.SketchFusion, efsignsgd.EFSignSGD,
    powersgd.PowerSGD)}
Marsit, BinSGDM, TopK, SketchFusion, EFSignSGD, PowerSGD = METHODS.values()


@dataclass(frozen=True)
class Preset:
    """A named configuration: ``cls(**kwargs)``."""
    cls: type
    kwargs: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))


PRESETS = {
    "marsit": Preset(Marsit),
    "marsit-global": Preset(Marsit, {"compensation": "global"}),  # the paper's memory
    "marsit-local": Preset(Marsit, {"compensation": "local"}),  # EF-signSGD-style memory
    "binsgdm": Preset(BinSGDM),
    "topk": Preset(TopK),
    "sketchfusion": Preset(SketchFusion),
    "marsit-rms": Preset(Marsit, {"precondition": "rms"}),
    "topk-rms": Preset(TopK, {"precondition": "rms"}),
    "sketchfusion-rms": Preset(SketchFusion, {"precondition": "rms"}),
    "marsit-adam": Preset(Marsit, {"precondition": "adam"}),
    "topk-adam": Preset(TopK, {"precondition": "adam"}),
    "sketchfusion-adam": Preset(SketchFusion, {"precondition": "adam"}),
    "efsignsgd": Preset(EFSignSGD),
    "powersgd": Preset(PowerSGD),  # rank 4 (8 under Adam)
}


def base_preset(method):
    """The name of ``method``'s base preset (its class with default arguments)."""
    return method.lower()


def build(name, **overrides):
    """A new compressor instance for preset ``name``: ``cls(**kwargs, **overrides)`` (overrides
    win). KeyError for an unknown name (Horovod's 'none'/'fp16' are not built here)."""
    preset = PRESETS[name]
    return preset.cls(**{**preset.kwargs, **overrides})


def _check():
    """Every method has its base preset; every preset is of a method. ValueError otherwise."""
    problems = [f"{name}: no base preset {base_preset(name)!r} = {name}()"
                for name, cls in METHODS.items()
                if base_preset(name) not in PRESETS or PRESETS[base_preset(name)].cls is not cls
                or PRESETS[base_preset(name)].kwargs]
    problems += [f"{name}: {p.cls.__name__} is not in METHODS" for name, p in PRESETS.items()
                 if p.cls not in METHODS.values()]
    if problems:
        raise ValueError("hvdcomp.registry: " + "; ".join(problems))


_check()
