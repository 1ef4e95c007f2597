"""The compression algorithms as pure math on backend arrays: no framework, no MPI."""


def moment_constants(betas, eps):
    """``((b1, b2), eps)`` as floats, for the moving averages of BinSGDM and precondition='adam';
    ValueError unless ``betas`` is a pair in [0, 1) and ``eps > 0``."""
    try:
        b1, b2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}") from None
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {betas}")
    if not float(eps) > 0.0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    return (b1, b2), float(eps)
