"""The Horovod release the facade was written against, and the check of the one found.

The facade reads Horovod's internals that its public API does not promise: the locals of the
functions that call ``compress()`` (tensor names, parameters, process sets, optimizers:
``hvdcomp.facade.frontends.naming`` and the tables in ``hvdcomp.facade.frontends.torch`` /
``.tensorflow``), the placeholder's reduced values (the op), ``hvd.join``. Those were read from Horovod
``WRITTEN_AGAINST``. Another release may have moved them; hvdcomp then still refuses what it
cannot name (``UnnamedTensorError`` on that rank, never a silent mix-up), but says up front which
release it was written for: once per process, a warning from the first front end that loads
Horovod.
"""
import logging
import warnings

WRITTEN_AGAINST = (0, 28)  # major, minor: horovod 0.28.x (built by scripts/setup.sh: 0.28.1)
log = logging.getLogger("hvdcomp")
_checked = set()


def release(version):
    """``(major, minor)`` of a version string such as ``'0.28.1'`` or ``'0.28.1rc0'``; None when
    it has no such prefix."""
    parts = str(version).split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (ValueError, IndexError):
        return None


def check(version):
    """Warn (once per version, ``UserWarning``) where Horovod ``version`` is not the release the
    facade was written against. Returns whether it is."""
    matches = release(version) == WRITTEN_AGAINST
    if not matches and version not in _checked:
        _checked.add(version)
        message = (f"hvdcomp's Horovod facade was written against Horovod "
                   f"{WRITTEN_AGAINST[0]}.{WRITTEN_AGAINST[1]}.x and found {version}: it reads "
                   "the tensor names from Horovod's own functions, which another release may "
                   "have changed (a tensor it cannot name raises UnnamedTensorError)")
        log.warning(message)
        warnings.warn(message, stacklevel=3)
    return matches


def check_installed():
    """``check`` of the Horovod this process imported (called where a front end loads it)."""
    import horovod
    return check(getattr(horovod, "__version__", "unknown"))
