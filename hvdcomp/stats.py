"""What a compressor did: bytes on the wire, compression ratio, and where the time went."""
import dataclasses


@dataclasses.dataclass
class StepStats:
    """Figures for one step (``last_stats``) or summed over steps (``total_stats``).

    ``bytes_sent``/``bytes_recv``: what this rank moved through hvdcomp's own MPI traffic,
    metadata included; ``rounds``: the exchanges it waited for one after another, each paying the
    link's latency (``hvdcomp.comm.stats.CommStats``; the agreement's all-gather included).
    ``horovod_bytes``: what Horovod's own allreduce sends per rank for the small tensors it sums
    for hvdcomp (``hvdcomp.engine.Entry.by_horovod``), computed as a ring
    all-reduce's ``2 (size-1)/size * bytes`` (Horovod's traffic is not measured here).
    ``fp32_ring_bytes``: what a plain fp32 ring all-reduce of the same elements would send per
    rank, ``2 (size-1)/size * 4 * elements``. ``ratio`` is its quotient by ``bytes_sent +
    horovod_bytes``.
    ``phases``: seconds spent encoding (compensation, packing, selection), communicating, and
    decoding; ``seconds`` is the whole flush. ``decision``: the compress-or-pass decision after
    the step (``hvdcomp.decision.Decision.as_dict``: mode, phase, threshold, switches).
    """

    steps: int = 0
    step: int = 0
    ranks: int = 1
    elements: int = 0
    compressed_elements: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    rounds: int = 0
    horovod_bytes: int = 0
    seconds: float = 0.0
    phases: dict = dataclasses.field(default_factory=dict)
    decision: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of_step(cls, **kw):
        return cls(steps=1, **kw)

    @property
    def fp32_ring_bytes(self):
        return ring_bytes(4 * self.elements, self.ranks)

    @property
    def ratio(self):
        sent = self.bytes_sent + self.horovod_bytes
        return self.fp32_ring_bytes / sent if sent else float("inf")

    def add(self, other):
        self.steps += other.steps
        self.step, self.ranks = other.step, other.ranks
        self.elements += other.elements
        self.compressed_elements += other.compressed_elements
        self.bytes_sent += other.bytes_sent
        self.bytes_recv += other.bytes_recv
        self.rounds += other.rounds
        self.horovod_bytes += other.horovod_bytes
        self.seconds += other.seconds
        for k, v in other.phases.items():
            self.phases[k] = self.phases.get(k, 0.0) + v
        self.decision = other.decision or self.decision

    def as_dict(self):
        d = dataclasses.asdict(self)
        d.update(fp32_ring_bytes=self.fp32_ring_bytes, ratio=self.ratio)
        return d

    def summary(self):
        per = max(self.steps, 1)
        ph = " ".join(f"{k}={1e3 * v / per:.1f}ms" for k, v in sorted(self.phases.items()))
        return (f"sent {(self.bytes_sent + self.horovod_bytes) / per / 1e6:.3f} MB/step/rank "
                f"(fp32 ring: {self.fp32_ring_bytes / per / 1e6:.3f} MB, {self.ratio:.1f}x less) "
                f"{self.rounds / per:.0f} rounds/step {ph}")


def ring_bytes(nbytes, ranks):
    """What each rank sends in a ring all-reduce of ``nbytes``: ``2 (ranks-1)/ranks * nbytes``."""
    return int(2 * (ranks - 1) * nbytes / ranks)
