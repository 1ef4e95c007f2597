"""Argument checks shared by every constructor: one way to say "an int >= 1", "one of", "a
fraction". Each raises ``ValueError`` naming the argument and the value it got."""
import numbers


def is_int(value):
    """An integer (``numbers.Integral``, NumPy's included), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def count(name, value, minimum=0):
    """``value`` as an int, checked to be an integer >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def optional_count(name, value, minimum=0):
    """None, or ``count(name, value, minimum)``."""
    if value is None:
        return None
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be None or an int >= {minimum}, got {value!r}")
    return int(value)


def fraction(name, value):
    """``value`` as a float in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return float(value)


def choice(name, value, options):
    """``value``, checked to be one of ``options``."""
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def flag(name, value):
    """``value``, checked to be True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def fusion_cost(mode, cost):
    """``cost`` (``fusion_cost=``): None, or for fusion='auto' only ``(latency >= 0 s,
    bandwidth > 0 B/s)``, returned as a tuple of floats (ValueError otherwise)."""
    if cost is None:
        return None
    if mode != "auto":
        raise ValueError(f"fusion_cost applies to fusion='auto' only (fusion={mode!r})")
    lat, bw = (float(c) for c in cost)
    if not (lat >= 0 and bw > 0):
        raise ValueError(f"fusion_cost must be (latency >= 0 s, bandwidth > 0 B/s), got {cost!r}")
    return lat, bw
