"""SketchFusion: Count-Sketch compression with worker-side error feedback. ``method.py``:
settings and phases; ``math.py``: the merged sketch and its recovery; ``sketch.py``: the
Count-Sketch itself; ``kernels.py``: its fused kernels."""
from hvdcomp.methods.sketchfusion.method import SketchFusion

__all__ = ["SketchFusion"]
