"""The learning rates of the examples' tasks, per named compression: what the examples use by
default and what the benchmarks run. Horovod's own ``"none"`` and ``"fp16"`` and every preset of
``hvdcomp.registry`` have rates here.

Tasks: ``"digits"`` (train_torch.py, 40 epochs, 4 ranks), ``"charlm"`` (train_charlm.py, 200
steps), ``"tf-digits"`` (train_tf.py, where it differs from ``"digits"``). The rates come from
the equal-effort sweep in benchmarks/convergence_tuning.md, chosen once and used for every seed.

Sign-based methods take steps of fixed size per element, so they want smaller rates; BinSGDM and
precondition='adam' carry their own momentum (and normaliser), so their inner optimizer is Adam
or plain SGD without momentum (BinSGDM's step has the gradient's scale under SGD: SGD's rates;
precondition='adam''s is Adam's direction: an Adam-like rate); precondition='rms' hands the
optimizer a gradient of about unit size per element, so its rate is a per-element step as for
Adam.

    >>> import recipes
    >>> recipes.lr_momentum("marsit-adam", "digits")  # (0.004, 0.0)
"""
from typing import NamedTuple

TASKS = ("digits", "charlm", "tf-digits")


class Rates(NamedTuple):
    """The inner optimizer for one task: learning rate, SGD momentum, and which optimizer
    (``"sgd"``, with ``momentum``, or ``"adam"``, where ``momentum`` is unused)."""
    lr: float
    momentum: float = 0.0
    optimizer: str = "sgd"


def sgd(lr, momentum=0.9):
    return Rates(lr, momentum, "sgd")


def adam(lr):
    return Rates(lr, 0.0, "adam")


# name -> task -> Rates: Horovod's baselines, then the registry's presets
RATES = {
    "none": {"digits": sgd(0.05), "charlm": adam(9e-3), "tf-digits": sgd(0.02)},
    "fp16": {"digits": sgd(0.05), "charlm": adam(9e-3), "tf-digits": sgd(0.02)},
    "marsit": {"digits": sgd(0.04), "charlm": adam(9e-3), "tf-digits": sgd(0.02)},
    "marsit-global": {"digits": sgd(0.04), "charlm": adam(9e-3)},
    "marsit-local": {"digits": sgd(0.04), "charlm": adam(3e-3)},
    "binsgdm": {"digits": sgd(0.5, 0.0), "charlm": adam(9e-3)},
    "topk": {"digits": sgd(0.1), "charlm": adam(2.7e-2)},
    "sketchfusion": {"digits": sgd(0.05), "charlm": adam(9e-3)},
    "marsit-rms": {"digits": sgd(0.0005), "charlm": adam(9e-3)},
    "topk-rms": {"digits": sgd(0.0005), "charlm": adam(2.7e-2)},
    "sketchfusion-rms": {"digits": sgd(0.0005), "charlm": adam(9e-3)},
    "marsit-adam": {"digits": sgd(0.004, 0.0), "charlm": sgd(9e-3, 0.0)},
    "topk-adam": {"digits": sgd(0.002, 0.0), "charlm": sgd(9e-3, 0.0)},
    "sketchfusion-adam": {"digits": sgd(0.008, 0.0), "charlm": sgd(9e-3, 0.0)},
    "efsignsgd": {"digits": sgd(0.02), "charlm": adam(3e-3)},
    # PowerSGD (rank 4): the uncompressed runs' rates, as the paper keeps the rate of SGD
    "powersgd": {"digits": sgd(0.05), "charlm": adam(9e-3)},
}

# Presets that only the examples offer; benchmarks/convergence.py runs the others by default.
NOT_BENCHMARKED = ("marsit-local",)


def rates(name, task, fallback=None):
    """``Rates(lr, momentum, optimizer)`` of ``name`` for ``task``; when the task has none for
    it, those of ``fallback`` (another task) if given, else KeyError."""
    table = RATES[name]
    if task not in table and fallback is not None:
        task = fallback
    if task not in table:
        raise KeyError(f"no {task!r} learning rate for {name!r} (has: {sorted(table)})")
    return table[task]


def lr_momentum(name, task, fallback=None):
    """``(lr, momentum)`` of ``name`` for ``task`` (see ``rates``)."""
    r = rates(name, task, fallback)
    return r.lr, r.momentum
