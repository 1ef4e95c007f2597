"""The one table of hvdcomp's methods and named presets, read by the examples, the tests and the
benchmarks.

- ``METHODS``: every public method, in order, name -> class (``"Marsit": hvdcomp.Marsit``).
- ``PRESETS``: named configurations, name -> ``Preset`` (class, constructor arguments, learning
  rates per task). Every method has a *base preset*, its lower-case name with no arguments
  (``"efsignsgd"`` is ``hvdcomp.EFSignSGD()``); the others are variants (``"marsit-adam"`` is
  ``hvdcomp.Marsit(precondition="adam")``).
- ``BASELINES``: learning rates of Horovod's own ``"none"`` and ``"fp16"`` per task (built by
  the caller: ``hvd.Compression.none`` / ``.fp16``; hvdcomp does not import Horovod here).
- ``EXPECT``: per method, what the all-methods tests and benchmarks check that differs by
  method (one-rank result, byte saving, which tensors keep state, invalid arguments, traffic
  law). Everything else they check holds for every method.

Tasks (keys of ``Preset.rates``): ``"digits"`` (examples/train_torch.py, 40 epochs, 4 ranks),
``"charlm"`` (examples/train_charlm.py, 200 steps), ``"tf-digits"`` (examples/train_tf.py, when
it differs from ``"digits"``), ``"digits-test"`` (the tests' 20-epoch 4-rank digits runs,
tests/conftest.py) and ``"tf-test"`` (the TensorFlow tests, tests/mpi/tf_train.py). The
examples' rates come from the equal-effort sweep in benchmarks/convergence_tuning.md; the tests'
are what the tests were written with. They differ per task on purpose.

Adding a method: its module in hvdcomp/ (a ``hvdcomp.method.Method`` subclass), and here its
line in ``METHODS`` (hvdcomp exports its compressor from there), its base preset (with
"digits", "charlm", "digits-test" and "tf-test" rates) and its ``EXPECT`` entry. Every
all-methods test and benchmark then picks it up; nothing else changes.

    >>> from hvdcomp import registry
    >>> comp = registry.build("marsit-adam", seed=1)  # Marsit(precondition="adam", seed=1)
    >>> registry.lr_momentum("marsit-adam", "digits")  # (0.004, 0.0)
"""
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional

from hvdcomp import binsgdm, efsignsgd, marsit, powersgd, sketchfusion, topk
from hvdcomp.facade import compressor_class

TASKS = ("digits", "charlm", "tf-digits", "digits-test", "tf-test")

# Each method's Horovod compressor (hvdcomp.facade.compressor_class), exported as hvdcomp.<name>.
METHODS = {m.name: compressor_class(m) for m in (
    marsit.Marsit, binsgdm.BinSGDM, topk.TopK, sketchfusion.SketchFusion, efsignsgd.EFSignSGD,
    powersgd.PowerSGD)}
Marsit, BinSGDM, TopK, SketchFusion, EFSignSGD, PowerSGD = METHODS.values()


class Rates(NamedTuple):
    """The inner optimizer for one task: learning rate, SGD momentum, and which optimizer
    (``"sgd"``, with ``momentum``, or ``"adam"``, where ``momentum`` is unused)."""
    lr: float
    momentum: float = 0.0
    optimizer: str = "sgd"


def _frozen(mapping):
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Preset:
    """A named configuration: ``cls(**kwargs)``, and its ``Rates`` per task. ``benchmark``: run
    by default by benchmarks/convergence.py (False: an extra option of the examples only)."""
    cls: type
    kwargs: Mapping = field(default_factory=dict)
    rates: Mapping = field(default_factory=dict)
    benchmark: bool = True

    def __post_init__(self):
        object.__setattr__(self, "kwargs", _frozen(self.kwargs))
        object.__setattr__(self, "rates", _frozen(self.rates))
        unknown = set(self.rates) - set(TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)}; tasks are {TASKS}")


def _sgd(lr, momentum=0.9):
    return Rates(lr, momentum, "sgd")


def _adam(lr):
    return Rates(lr, 0.0, "adam")


# Sign-based methods take steps of fixed size per element, so they want smaller rates; BinSGDM
# and precondition='adam' carry their own momentum (and normaliser), so their inner optimizer is
# Adam or plain SGD without momentum (BinSGDM's step has the gradient's scale under SGD: SGD's
# rates; precondition='adam''s is Adam's direction: an Adam-like rate); precondition='rms' hands
# the optimizer a gradient of about unit size per element, so its rate is a per-element step as
# for Adam.
BASELINES = {
    "none": {"digits": _sgd(0.05), "charlm": _adam(9e-3), "tf-digits": _sgd(0.02),
             "digits-test": _sgd(0.05)},
    "fp16": {"digits": _sgd(0.05), "charlm": _adam(9e-3), "tf-digits": _sgd(0.02)},
}

# "digits-test" (tests/conftest.py: 20 epochs, 4 ranks), fixed when the tests were written; the
# examples' "digits" rates were re-tuned later by the convergence sweep. Marsit uses the sweep's
# 0.04: at 0.02 its 20-epoch accuracy over 4 merge seeds was 0.889-0.956, too close to the tests'
# 5-point tolerance; at 0.04, 0.942-0.969. SketchFusion: 0.1, not the 40-epoch benchmark's 0.05
# (there 0.05 and 0.1 tie): over these 20 epochs its delayed updates want the larger rate.
# Default SketchFusion, hash seeds 0-4: 0.881 / 0.931 / 0.928 / 0.953 / 0.944 at 0.05 (0.972 /
# 0.947 / 0.944 / 0.922 / 0.900 with the earlier random hashes), 0.939 / 0.950 / 0.950 / 0.917 /
# 0.967 at 0.1; narrow 0.925 -> 0.975. EFSignSGD (momentum 0.9; it draws no random numbers, so
# one run per rate; uncompressed 0.964, so the tolerance asks for >= 0.914): lr 0.01: 0.944,
# 0.015: 0.886, 0.018: 0.942, 0.02: 0.958, 0.022: 0.925, 0.025: 0.944, 0.03: 0.953, 0.04: 0.903,
# 0.05: 0.875, 0.08: 0.658; 0.025 is the middle of the band 0.018-0.03 where every rate tried
# passes (lowest 0.925).
PRESETS = {
    "marsit": Preset(Marsit, {}, {"digits": _sgd(0.04), "charlm": _adam(9e-3),
                                  "tf-digits": _sgd(0.02), "digits-test": _sgd(0.04),
                                  "tf-test": _sgd(0.02, 0.0)}),
    "marsit-global": Preset(Marsit, {"compensation": "global"},  # the paper's memory
                            {"digits": _sgd(0.04), "charlm": _adam(9e-3)}),
    "marsit-local": Preset(Marsit, {"compensation": "local"},  # EF-signSGD-style memory
                           {"digits": _sgd(0.04), "charlm": _adam(3e-3)}, benchmark=False),
    "binsgdm": Preset(BinSGDM, {}, {"digits": _sgd(0.5, 0.0), "charlm": _adam(9e-3),
                                    "digits-test": _sgd(0.5, 0.0),
                                    "tf-test": _sgd(0.5, 0.0)}),
    "topk": Preset(TopK, {}, {"digits": _sgd(0.1), "charlm": _adam(2.7e-2),
                              "digits-test": _sgd(0.05), "tf-test": _sgd(0.05, 0.0)}),
    "sketchfusion": Preset(SketchFusion, {}, {"digits": _sgd(0.05), "charlm": _adam(9e-3),
                                              "digits-test": _sgd(0.1),
                                              "tf-test": _sgd(0.05, 0.0)}),
    "marsit-rms": Preset(Marsit, {"precondition": "rms"},
                         {"digits": _sgd(0.0005), "charlm": _adam(9e-3),
                          "digits-test": _sgd(0.002)}),
    "topk-rms": Preset(TopK, {"precondition": "rms"},
                       {"digits": _sgd(0.0005), "charlm": _adam(2.7e-2),
                        "digits-test": _sgd(0.002)}),
    "sketchfusion-rms": Preset(SketchFusion, {"precondition": "rms"},
                               {"digits": _sgd(0.0005), "charlm": _adam(9e-3)}),
    "marsit-adam": Preset(Marsit, {"precondition": "adam"},
                          {"digits": _sgd(0.004, 0.0), "charlm": _sgd(9e-3, 0.0),
                           "digits-test": _sgd(0.002, 0.0), "tf-test": _sgd(0.002, 0.0)}),
    "topk-adam": Preset(TopK, {"precondition": "adam"},
                        {"digits": _sgd(0.002, 0.0), "charlm": _sgd(9e-3, 0.0),
                         "digits-test": _sgd(0.002, 0.0)}),
    "sketchfusion-adam": Preset(SketchFusion, {"precondition": "adam"},
                                {"digits": _sgd(0.008, 0.0), "charlm": _sgd(9e-3, 0.0)}),
    # EF-signSGD: "digits"/"charlm" from the sweep in benchmarks/convergence_tuning.md
    "efsignsgd": Preset(EFSignSGD, {}, {"digits": _sgd(0.02), "charlm": _adam(3e-3),
                                        "digits-test": _sgd(0.025),
                                        "tf-test": _sgd(0.02, 0.0)}),
    # PowerSGD (rank 4): the uncompressed runs' rates, as the paper keeps the rate of SGD
    "powersgd": Preset(PowerSGD, {}, {"digits": _sgd(0.05), "charlm": _adam(9e-3),
                                      "digits-test": _sgd(0.05), "tf-test": _sgd(0.05, 0.0)}),
}


@dataclass(frozen=True)
class Expect:
    """What the all-methods tests and benchmarks expect of a method, where it depends on it.

    - ``one_rank``: the result of one rank's all-reduce of ``g`` (tests/mpi/one_rank.py):
      ``"identity"`` (``g``), ``"sign"`` (``sign(g)``) or ``"scaled-sign"``
      (``mean|g| * sign(g)``), built with ``one_rank_kwargs``.
    - ``min_ratio``: on the 4-rank digits test (tests/test_training.py), bytes sent at least this
      many times fewer than an fp32 ring all-reduce; None: the method is trained by its own test.
    - ``small_exact``: tensors under ``min_compress_numel`` are summed exactly in fp32 and keep
      no state (False: every tensor goes through the method, e.g. BinSGDM's biases are voted
      on, or step aside, like its other tensors).
    - ``test_kwargs``: constructor arguments for the tests' tensors of a few thousand elements.
    - ``invalid``: ``(argument, value)`` pairs the constructor refuses with a ValueError naming
      the argument.
    - ``traffic``: how bytes and message rounds grow with the world (benchmarks/cost_model.py):
      ``"ring"``, ``"two-rings"`` (SketchFusion), ``"two-allreduces"`` (PowerSGD: MPI's own,
      ``hvdcomp.comm.mpi_allreduce``), ``"tree"`` (TopK), ``"nodes"`` (BinSGDM), ``"votes"``
      (EF-signSGD, ``hvdcomp.comm.votes``).
    - ``state_suffixes``: state a method keeps per tensor beside its memory, under
      ``'<name><suffix>'`` (PowerSGD's ``'#q'``); ``state_keys`` lists what a checkpoint holds.
    - ``exact_vectors``: a compressed 1-D tensor is sent whole, exactly, and keeps no state
      (PowerSGD: a vector has no low-rank form).
    """
    one_rank: str
    min_ratio: Optional[float]
    small_exact: bool = True
    one_rank_kwargs: Mapping = field(default_factory=dict)
    test_kwargs: Mapping = field(default_factory=dict)
    invalid: tuple = ()
    traffic: str = "ring"
    state_suffixes: tuple = ()
    exact_vectors: bool = False

    def __post_init__(self):
        object.__setattr__(self, "one_rank_kwargs", _frozen(self.one_rank_kwargs))
        object.__setattr__(self, "test_kwargs", _frozen(self.test_kwargs))

    def state_keys(self, tensors):
        """The sorted state keys of a checkpoint whose stateful tensors are ``tensors``."""
        return sorted([*tensors, *(t + s for t in tensors for s in self.state_suffixes)])


_COMMON_INVALID = (("min_compress_numel", -1), ("on_nonfinite", "ignore"), ("seed", -1),
                   ("hierarchy", "nodes"))

EXPECT = {
    "Marsit": Expect("scaled-sign", 20, invalid=(
        ("on_nonfinite", "ignore"), ("compensation", "none"), ("min_compress_numel", -1),
        ("min_compress_numel", 2.5), ("seed", -1), ("seed", "x"), ("seed", 1.5))),
    "BinSGDM": Expect("sign", None, small_exact=False, traffic="nodes", invalid=(
        ("betas", (1.0, 0.9)), ("betas", (0.9, -0.1)), ("betas", (0.9,)), ("eps", 0),
        ("eps", float("nan")), ("uneven", "maybe"), ("ranks_per_node", 0),
        ("ranks_per_node", 1.5), ("on_nonfinite", "ignore"), ("seed", -2))),
    "TopK": Expect("identity", 20, traffic="tree",
                   one_rank_kwargs={"ratio": 1.0, "selection": "exact"},
                   test_kwargs={"ratio": 0.1}, invalid=(
                       ("k", 0), ("k", -3), ("k", 2.5), ("ratio", 0), ("ratio", 1.5),
                       ("ratio", float("nan")), ("path", "ring"), ("selection", "sort"),
                       ("bidirectional", "yes")) + _COMMON_INVALID),
    # the default sketch (1 x 2k per 5% of elements, plus k exact values: 3k halves) sends
    # 0.075 of fp32's bytes (12x fewer on the digits MLP)
    "SketchFusion": Expect("identity", 2.5, traffic="two-rings",
                           one_rank_kwargs={"ratio": 1.0, "rows": 1, "width": 1},
                           test_kwargs={"ratio": 0.1, "rows": 3, "width": 4}, invalid=(
                               ("ratio", 0), ("ratio", 1.5), ("rows", 0), ("cols", 0),
                               ("width", 0), ("exact", "yes"), ("seed", -1), ("wire", 16),
                               ("min_compress_numel", -1), ("on_nonfinite", "ignore"))),
    # the vote counted along a ring (hvdcomp.comm.votes): 2.75 bits per element at 4 ranks,
    # ~15x fewer bytes than fp32 with the metadata
    "EFSignSGD": Expect("scaled-sign", 10, traffic="votes", invalid=(
        ("min_compress_numel", -1), ("min_compress_numel", 2.5), ("on_nonfinite", "ignore"),
        ("seed", -1), ("fusion", "sometimes"), ("precondition", "sgd"))),
    # rank 4 on the digits model: 4 (n + m) floats per weight matrix, ~17x fewer bytes; a
    # vector (or any matrix with min(n, m) <= rank) is sent whole, exactly
    "PowerSGD": Expect("identity", 10, traffic="two-allreduces", state_suffixes=("#q",),
                       exact_vectors=True,
                       one_rank_kwargs={"rank": 1 << 20}, test_kwargs={"rank": 2}, invalid=(
                           ("rank", 0), ("rank", 1.5), ("rank", "two")) + _COMMON_INVALID),
}


def base_preset(method):
    """The name of ``method``'s base preset (its class with default arguments)."""
    return method.lower()


def build(name, **overrides):
    """A new compressor instance for preset ``name``: ``cls(**kwargs, **overrides)`` (overrides
    win). KeyError for an unknown name (Horovod's 'none'/'fp16' are not built here)."""
    preset = PRESETS[name]
    return preset.cls(**{**preset.kwargs, **overrides})


def rates(name, task, fallback=None):
    """``Rates(lr, momentum, optimizer)`` of preset or baseline ``name`` for ``task``; when the
    task has none for it, those of ``fallback`` (another task) if given, else KeyError."""
    table = PRESETS[name].rates if name in PRESETS else BASELINES[name]
    if task not in table and fallback is not None:
        task = fallback
    if task not in table:
        raise KeyError(f"no {task!r} learning rate for {name!r} (has: {sorted(table)})")
    return table[task]


def lr_momentum(name, task, fallback=None):
    """``(lr, momentum)`` of preset or baseline ``name`` for ``task`` (see ``rates``)."""
    r = rates(name, task, fallback)
    return r.lr, r.momentum


def presets_for(task):
    """The preset names that have rates for ``task``, in table order."""
    return [n for n, p in PRESETS.items() if task in p.rates]


def _check():
    """Every method has an EXPECT entry and a base preset with the rates the tests need; every
    preset has the examples' rates. Raises ValueError at import otherwise."""
    problems = [f"{m}: no EXPECT entry" for m in METHODS if m not in EXPECT]
    for name, cls in METHODS.items():
        base = PRESETS.get(base_preset(name))
        if base is None or base.cls is not cls or base.kwargs:
            problems.append(f"{name}: no base preset {base_preset(name)!r} = {name}()")
            continue
        missing = {"digits-test", "tf-test"} - set(base.rates)
        if missing:
            problems.append(f"{name}: base preset lacks rates for {sorted(missing)}")
    for name, p in PRESETS.items():
        if p.cls not in METHODS.values():
            problems.append(f"{name}: {p.cls.__name__} is not in METHODS")
        if not {"digits", "charlm"} <= set(p.rates):
            problems.append(f"{name}: lacks the examples' 'digits'/'charlm' rates")
    if problems:
        raise ValueError("hvdcomp.registry: " + "; ".join(problems))


_check()
