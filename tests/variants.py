"""The tests' named hvdcomp compressions: every preset of hvdcomp/registry.py under its own name,
and test-local variants of them (a preset with test-specific arguments such as a seed, or its
class passed bare, i.e. its default instance). A variant's learning rates are its preset's
(``expect.rates(preset, task)``: tests/expect.py). Horovod's own 'none' and 'fp16' are built by
the rank scripts (tests/mpi/torch_common.py).

No MPI and no Horovod here: imported by the test modules (tests/conftest.py) and by the rank
scripts alike.
"""
import expect
from hvdcomp import AdamSettings, registry

BARE = None  # in place of the overrides: the preset's class itself, passed bare

# name -> (registry preset, constructor overrides, or BARE)
VARIANTS = {
    "marsit": ("marsit", dict(seed=5)),
    "marsit-auto": ("marsit", dict(seed=5, fusion="auto")),
    "marsit-layerwise": ("marsit", dict(seed=5, fusion="layerwise")),  # buckets fixed by the model
    "marsit-rms": ("marsit-rms", dict(seed=5)),
    "marsit-adam": ("marsit-adam", dict(seed=5)),
    # precondition='adam': warm-ups that end before (marsit) and after (topk) the resume test's
    # checkpoint at step 6; the training test's 220 steps use the default
    "marsit-adam-w4": ("marsit-adam", dict(seed=5, precondition=AdamSettings(warmup=4))),
    "topk-adam-w8": ("topk-adam", dict(ratio=0.01, seed=3,
                                       precondition=AdamSettings(warmup=8))),
    "binsgdm": ("binsgdm", dict(seed=3)),
    # every tensor passed: BinSGDM steps aside (hvdcomp.stepaside), its messages through Horovod
    "binsgdm-aside": ("binsgdm", dict(seed=3, decision="pass")),
    "topk": ("topk", dict(ratio=0.01, seed=3)),
    "topk-rms": ("topk-rms", dict(ratio=0.01, seed=3)),
    "topk-bare": ("topk", BARE),
    "topk-defaults": ("topk", dict()),  # an instance with the class's defaults
    "topk-auto": ("topk", dict(fusion="auto")),  # as topk-bare, with LayerFusion
    "topk-allgather": ("topk", dict(path="allgather")),
    "topk-uni": ("topk", dict(bidirectional=False)),
    "sketchfusion-bare": ("sketchfusion", BARE),
    "sketchfusion-narrow": ("sketchfusion", dict(ratio=0.02, rows=3, width=4)),
    "sketchfusion-1pct": ("sketchfusion", dict(ratio=0.01)),  # the default sketch until issue 30
}


def preset_of(name):
    """The registry preset behind test name ``name`` (a variant's, or ``name`` itself)."""
    return VARIANTS[name][0] if name in VARIANTS else name


def method_of(name):
    """The registry method name (e.g. 'TopK') of test name ``name``."""
    return registry.PRESETS[preset_of(name)].cls.__name__


def make(name):
    """The hvdcomp compression for test name ``name``: a new instance, or the class (bare)."""
    preset, overrides = VARIANTS.get(name, (name, {}))
    if overrides is BARE:
        return registry.PRESETS[preset].cls
    return registry.build(preset, **overrides)


def compressor_object(compression):
    """The hvdcomp instance behind ``compression`` (the default instance for a bare class), or
    None for Horovod's own compressions."""
    import hvdcomp
    if isinstance(compression, type) and issubclass(compression, hvdcomp.BatchedCompressor):
        return compression.default()
    return compression if isinstance(compression, hvdcomp.BatchedCompressor) else None


def rates(name, task):
    """``(lr, momentum)`` of test name ``name`` (or of Horovod's 'none'/'fp16') for ``task``."""
    return expect.lr_momentum(preset_of(name), task)


def settings_for(task):
    """``{test name: (lr, momentum)}`` of every name with rates for ``task``: Horovod's
    baselines, the registry's presets and the variants."""
    out = {}
    for name in ["none", "fp16", *registry.PRESETS, *VARIANTS]:
        try:
            out[name] = rates(name, task)
        except KeyError:
            pass
    return out
