"""PowerSGD: rank-r power iteration with error feedback and warm start (``method.py``)."""
from hvdcomp.methods.powersgd.method import PowerSGD

__all__ = ["PowerSGD"]
