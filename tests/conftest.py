"""Shared fixtures and launches of the tests, and their tiers: every test is marked ``ranks``
(it launches processes: MPI ranks, a torchrun job, any subprocess, itself or through a helper
or fixture) or ``unit`` (in-process only). ``make test`` runs both; ``make unit`` and
``make ranks`` one tier."""
import inspect
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The tests of what a method does force it to compress (hvdcomp.decision's 'compress' mode, for
# these ranks too: they inherit the environment); the tests of the compress-or-pass decision
# (tests/test_decision.py) set the mode they test.
os.environ.setdefault("HVDCOMP_DECISION", "compress")
# tf.keras as Keras 2 (tf-keras), here and in the ranks, as scripts/mpi_env.sh sets it: Horovod's
# Keras front end needs it (tests/test_stack.py sets "0" for its plain Keras 3 ranks).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# Horovod's background thread coordinates the ranks with an MPI collective every cycle, whose
# waits spin on shared cores: four idle ranks of this 2-core machine used both cores at the default
# cycle (each allreduce 0.5 ms), a tenth of one at 10 ms (each allreduce 10 ms). The ranks of a test
# (more ranks than cores) then compute instead: test_training's launch 51 -> 28 s, the TensorFlow
# 4-rank launch 83 -> 65 s (measured 2026-12-07 at 411ad10). What a test checks does not depend
# on it; a test may set its own.
os.environ.setdefault("HOROVOD_CYCLE_TIME", "10")

from mpirun import results, run, shared  # noqa: E402

from variants import settings_for  # noqa: E402

# (lr, momentum) per test name for the tests' digits runs (20 epochs, 4 ranks): task "digits-test"
# of tests/expect.py (how each rate was chosen is noted there); a test-local variant of
# tests/variants.py takes its preset's rates.
SETTINGS = settings_for("digits-test")
EPOCHS = 20


@shared
def train_launch(cases, ranks, env_items):
    """One launch of tests/mpi/train.py on ``ranks`` ranks (environment ``env_items``) for every
    ``(name, epochs)`` of ``cases``, at each test name's rates."""
    args = [a for name, epochs in cases for a in (name, epochs, *SETTINGS[name])]
    return run(ranks, "train.py", *args, env=dict(env_items),
               timeout=180 + sum(3 * epochs for _, epochs in cases))


def train_digits(name, ranks=4, env=None, epochs=EPOCHS, launched_with=()):
    """Run tests/mpi/train.py for compression ``name`` on ``ranks`` ranks for ``epochs`` epochs
    (11 steps each); check that every rank stayed bit-identical after every step and return the
    per-rank results. ``launched_with``: the ``(name, epochs)`` cases (this one among them) of
    one launch that the tests asking for any of them share (``mpirun.shared``)."""
    cases = tuple(launched_with) or ((name, epochs),)
    assert (name, epochs) in cases, (name, epochs, cases)
    res = results(train_launch(cases, ranks, tuple(sorted((env or {}).items()))),
                  case=f"{name}-{epochs}")
    assert sorted(res) == list(range(ranks))
    assert all(r["identical_steps"] == r["steps"] == 11 * epochs for r in res.values())
    assert len({(r["acc"], r["loss"]) for r in res.values()}) == 1  # one model everywhere
    return res


@shared
def decision_launch(cases, env_items):
    """One launch of tests/mpi/decision.py on 4 ranks (environment ``env_items``) for every
    ``(compression, lr, mode)`` of ``cases``."""
    return run(4, "decision.py", *(a for case in cases for a in case), env=dict(env_items),
               timeout=90 + 45 * len(cases))


def decision_results(name, lr, mode, launched_with, env):
    """The per-rank results of case ``(name, lr, mode)`` of tests/mpi/decision.py, from the one
    launch (environment ``env``) of the cases ``launched_with`` (this one among them) that the
    tests asking for any of them share."""
    assert (name, lr, mode) in launched_with, ((name, lr, mode), launched_with)
    return results(decision_launch(tuple(launched_with), tuple(sorted(env.items()))),
                   case=f"{name}-{mode}")


@pytest.fixture(scope="session")
def uncompressed():
    """The 4-rank uncompressed SGD-momentum run every method is compared with (run once)."""
    res = train_digits("none")
    assert res[0]["acc"] > 0.9
    return res[0]


# -- tiers -----------------------------------------------------------------------------------------
def _launches(fn, seen):
    """Whether calling ``fn`` (a function, or a fixture's) may launch processes: it names
    ``subprocess``, a launcher (``launches_ranks``: ``mpirun.run``, ``torchrun.run``, a
    ``shared`` launch) or a function of the tests that does."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or fn in seen:
        return False
    seen.add(fn)
    module = sys.modules.get(fn.__module__)
    names, stack = set(), [code]
    while stack:  # the function's names, with those of its nested functions and lambdas
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    for name in names:
        obj = getattr(module, name, None)
        if getattr(obj, "launches_ranks", False) or (
                isinstance(obj, types.ModuleType) and obj.__name__ == "subprocess"):
            return True
        if inspect.isfunction(obj) and _launches(obj, seen):
            return True
    return False


def pytest_configure(config):
    config.addinivalue_line("markers", "ranks: launches processes (MPI ranks, torchrun, tools)")
    config.addinivalue_line("markers", "unit: in-process only")


def pytest_collection_modifyitems(config, items):
    for item in items:
        seen = set()
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values()
                    for d in defs]
        launches = any(_launches(f, seen) for f in [item.function, *fixtures])
        item.add_marker(pytest.mark.ranks if launches else pytest.mark.unit)
