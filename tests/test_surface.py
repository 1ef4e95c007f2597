"""The public surface: importable, usable bare and configured, clear errors for what is not
there yet or is misconfigured. (No MPI needed: nothing here communicates.)"""
import pytest
import torch

import expect
import hvdcomp
import recipes  # examples/recipes.py (on the path through tests/expect.py)
from hvdcomp import registry


def test_public_names_import():
    for name, cls in registry.METHODS.items():  # every method of hvdcomp/registry.py
        assert getattr(hvdcomp, name) is cls and name in hvdcomp.__all__
        assert cls.method == name  # the name its errors carry
    assert hvdcomp.DEFAULT is hvdcomp.Marsit


@pytest.mark.parametrize("name", list(registry.PRESETS))
def test_every_registry_preset_builds_and_has_the_examples_rates(name):
    """Each preset builds a configured instance of its class (overrides win) and has the
    examples' learning rates (examples/recipes.py); every method's base preset is the class with
    its defaults and has the tests' rates and expectations (tests/expect.py)."""
    preset = registry.PRESETS[name]
    comp = registry.build(name)
    assert type(comp) is preset.cls and comp is not registry.build(name)
    assert registry.build(name, seed=7).seed == 7
    for task in ("digits", "charlm"):
        lr, momentum = recipes.lr_momentum(name, task)
        assert lr > 0 and 0 <= momentum < 1
    assert recipes.rates(name, "tf-digits", fallback="digits").lr > 0
    if name == registry.base_preset(preset.cls.__name__):
        assert not preset.kwargs and registry.METHODS[preset.cls.__name__] is preset.cls
        assert preset.cls.__name__ in expect.EXPECT
        for task in expect.TASKS:
            assert expect.rates(name, task).lr > 0


def test_the_rates_tables_name_only_presets_and_horovods_baselines():
    known = {"none", "fp16", *registry.PRESETS}
    assert set(recipes.RATES) == known and set(expect.RATES) <= known
    assert set(recipes.NOT_BENCHMARKED) <= set(registry.PRESETS)
    assert set(expect.EXPECT) == set(expect.ROUNDS) == set(registry.METHODS)


def test_registry_and_rates_reject_unknown_names_and_tasks():
    with pytest.raises(KeyError):
        registry.build("nonesuch")
    with pytest.raises(KeyError, match="no 'charlm-typo' learning rate"):
        recipes.rates("marsit", "charlm-typo")
    assert recipes.lr_momentum("none", "digits") == (0.05, 0.9)  # Horovod's baselines too
    with pytest.raises(KeyError, match="no 'tf-test' learning rate"):
        expect.rates("marsit-global", "tf-test")
    assert expect.rates("marsit-global", "tf-test", fallback="digits") == recipes.rates(
        "marsit-global", "digits")


def test_bare_class_uses_one_default_instance_per_class():
    a = hvdcomp.Marsit.compress.__self__
    assert a is hvdcomp.Marsit.default() and isinstance(a, hvdcomp.Marsit)
    assert hvdcomp.Marsit.decompress.__self__ is a
    configured = hvdcomp.Marsit(seed=4)
    assert configured.compress.__self__ is configured and configured.seed == 4


@pytest.mark.parametrize("kwargs", [{"on_nonfinite": "ignore"}, {"compensation": "none"},
                                    {"min_compress_numel": -1}])
def test_invalid_marsit_settings_rejected_at_construction(kwargs):
    with pytest.raises(ValueError):
        hvdcomp.Marsit(**kwargs)


def test_the_facade_checks_the_horovod_release_it_was_written_against():
    """The installed Horovod (scripts/setup.sh builds 0.28.1) passes silently; another release
    warns once, naming both; a version string with no release prefix is not taken for it."""
    import warnings

    import horovod

    from hvdcomp.facade import horovod_version
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert horovod_version.check_installed() and horovod_version.check(horovod.__version__)
    assert horovod_version.release("0.28.1rc0") == (0, 28) and horovod_version.release("x") is None
    with pytest.warns(UserWarning, match=r"written against Horovod 0\.28\.x and found 0\.29\.2"):
        assert not horovod_version.check("0.29.2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not horovod_version.check("0.29.2")  # once per version
