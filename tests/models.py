"""Small torch models the rank scripts share (no Horovod, no MPI: tests/mpi and tests/ddp
scripts import it alike)."""
import torch


class WithUnused(torch.nn.Module):
    """``inner`` beside a layer ``unused`` that no step uses: its gradient is never computed
    (Horovod's optimizer zero-fills it; DDP needs ``find_unused_parameters=True``)."""

    def __init__(self, inner, features=3):
        super().__init__()
        self.inner, self.unused = inner, torch.nn.Linear(features, features)

    def forward(self, x):
        return self.inner(x)
