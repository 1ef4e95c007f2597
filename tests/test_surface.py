"""The public surface: importable, usable bare and configured, clear errors for what is not
there yet or is misconfigured. (No MPI needed: nothing here communicates.)"""
import pytest
import torch

import hvdcomp


def test_public_names_import():
    for name in ("Marsit", "BinSGDM", "TopK", "SketchFusion"):
        assert isinstance(getattr(hvdcomp, name), type)
    assert hvdcomp.DEFAULT is hvdcomp.Marsit


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
