"""EF-signSGD with majority vote. ``method.py``: settings and phases (the sign message of
``hvdcomp.signs``); ``votes.py``: its collective, the vote counted exactly along a ring."""
from hvdcomp.methods.efsignsgd.method import EFSignSGD

__all__ = ["EFSignSGD"]
