"""Public names of methods that are not implemented yet.

They can be imported, passed as ``compression=`` and configured, so user code written against the
stable surface keeps importing; using one (compress, decompress, state) raises
NotImplementedError naming the method.
"""
from hvdcomp.compressor import BatchedCompressor, default_instance


class _Planned(BatchedCompressor):
    issue = ""

    def __init__(self, **config):
        super().__init__()
        self.config = config

    def _unavailable(self, *args, **kwargs):
        raise NotImplementedError(
            f"hvdcomp.{self.method} is not implemented yet ({self.issue}); available now: "
            "hvdcomp.Marsit")

    compress = decompress = state_dict = load_state_dict = default_instance(_unavailable)


class SketchFusion(_Planned):
    """Count-Sketch compression with LayerFusion (planned)."""
    method, issue = "SketchFusion", "issue 6"
