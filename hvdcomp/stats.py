"""What a compressor did: bytes on the wire, compression ratio, and where the time went."""
import dataclasses


@dataclasses.dataclass
class StepStats:
    """Figures for one step (``last_stats``) or summed over steps (``total_stats``).

    ``bytes_sent``/``bytes_recv``: what this rank moved through hvdcomp's own MPI traffic,
    metadata included. ``fp32_ring_bytes``: what a plain fp32 ring all-reduce of the same
    elements would send per rank, ``2 (size-1)/size * 4 * elements``. ``ratio`` is their quotient.
    ``phases``: seconds spent encoding (compensation, packing, selection), communicating, and
    decoding; ``seconds`` is the whole flush.
    """

    steps: int = 0
    step: int = 0
    ranks: int = 1
    elements: int = 0
    compressed_elements: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0
    phases: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of_step(cls, **kw):
        return cls(steps=1, **kw)

    @property
    def fp32_ring_bytes(self):
        return int(2 * (self.ranks - 1) * 4 * self.elements / self.ranks)

    @property
    def ratio(self):
        return self.fp32_ring_bytes / self.bytes_sent if self.bytes_sent else float("inf")

    def add(self, other):
        self.steps += other.steps
        self.step, self.ranks = other.step, other.ranks
        self.elements += other.elements
        self.compressed_elements += other.compressed_elements
        self.bytes_sent += other.bytes_sent
        self.bytes_recv += other.bytes_recv
        self.seconds += other.seconds
        for k, v in other.phases.items():
            self.phases[k] = self.phases.get(k, 0.0) + v

    def as_dict(self):
        d = dataclasses.asdict(self)
        d.update(fp32_ring_bytes=self.fp32_ring_bytes, ratio=self.ratio)
        return d

    def summary(self):
        per = max(self.steps, 1)
        ph = " ".join(f"{k}={1e3 * v / per:.1f}ms" for k, v in sorted(self.phases.items()))
        return (f"sent {self.bytes_sent / per / 1e6:.3f} MB/step/rank "
                f"(fp32 ring: {self.fp32_ring_bytes / per / 1e6:.3f} MB, {self.ratio:.1f}x less) {ph}")
