"""What every part of ``MemoryStore`` stands on: the queue's keys and limits, its state on
the server, the server's clock and wake-ups."""

from collections.abc import Sequence

from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.memory.server import MemoryServer, MemoryWakeups, QueueState
from delayqueue_django.engine.records import StoreLimits


class MemoryStoreBase:
    """One queue's keys on a memory server: its state, clock and wake-ups."""

    def __init__(self, server: MemoryServer, keys: QueueKeys, limits: StoreLimits) -> None:
        self.server = server
        self._keys = keys
        self._limits = limits
        self._channel = keys.wakeup_channel

    @property
    def keys(self) -> QueueKeys:
        return self._keys

    def server_name(self) -> str:
        return f"memory {id(self.server)}"

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    def _state(self) -> QueueState:
        return self.server.state(self._keys.tag)

    def _now(self) -> int:
        return self.server.clock.now_ms()

    def _now_with_us(self) -> tuple[int, int]:
        """The clock in ms, and the µs past that ms (0-999), as now_ms() reads Redis's."""
        return divmod(self.server.clock.now_us(), 1000)

    def _wake(self, due_ms: int) -> None:
        self.server.publish(self._channel, due_ms)

    def place(self, message_ids: list[str], keys: Sequence[str | None] | None = None) -> list[str]:
        """New ids as this store files them: as they are (one queue, one set of keys)."""
        return message_ids

    def subscribe_wakeups(self) -> MemoryWakeups:
        return MemoryWakeups(self.server, [self._channel])

    def subscribe_channels(self, channels: Sequence[str]) -> MemoryWakeups:
        """Listen on several queues' wake-up channels (a sharded queue's) of this server."""
        return MemoryWakeups(self.server, channels)
