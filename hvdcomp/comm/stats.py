"""Byte and time counters for hvdcomp's own MPI traffic."""
import dataclasses


@dataclasses.dataclass
class CommStats:
    """Counts of what this rank sent and received through hvdcomp's communicators."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    messages: int = 0
    seconds: float = 0.0

    def add(self, sent, recv, messages=1):
        self.bytes_sent += int(sent)
        self.bytes_recv += int(recv)
        self.messages += int(messages)

    def snapshot(self):
        return dataclasses.replace(self)

    def since(self, before):
        """The counts accumulated after the snapshot ``before``."""
        return CommStats(self.bytes_sent - before.bytes_sent, self.bytes_recv - before.bytes_recv,
                         self.messages - before.messages, self.seconds - before.seconds)
