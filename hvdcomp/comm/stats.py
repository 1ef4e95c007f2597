"""Byte, round and time counters for hvdcomp's own traffic."""
import dataclasses


@dataclasses.dataclass
class CommStats:
    """Counts of what this rank sent and received through hvdcomp's communicators: bytes,
    messages, and ``rounds``, the exchanges it waited for one after another (each costs the
    link's latency: a ring all-reduce over P ranks takes 2 (P - 1), an all-gather or an MPI
    all-reduce one, a sparse transfer two: its header, then its payload)."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    messages: int = 0
    seconds: float = 0.0
    rounds: int = 0

    def add(self, sent, recv, messages=1, rounds=1):
        self.bytes_sent += int(sent)
        self.bytes_recv += int(recv)
        self.messages += int(messages)
        self.rounds += int(rounds)

    def snapshot(self):
        return dataclasses.replace(self)

    def since(self, before):
        """The counts accumulated after the snapshot ``before``."""
        return CommStats(self.bytes_sent - before.bytes_sent, self.bytes_recv - before.bytes_recv,
                         self.messages - before.messages, self.seconds - before.seconds,
                         self.rounds - before.rounds)
