"""What every part of ``MemoryStore`` stands on: the queue's keys and limits, its state on
the server, the server's clock and wake-ups."""

from collections.abc import Sequence

from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.memory import key_index, outcomes
from delayqueue_django.engine.memory.server import MemoryServer, MemoryWakeups, QueueState
from delayqueue_django.engine.outcomes import REPLACED, ended_message
from delayqueue_django.engine.records import StoredMessage, StoreLimits


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

    # Outcome records (see memory/outcomes.py): written only when the queue keeps them.

    def _end(
        self,
        state: QueueState,
        message_id: str,
        outcome: str,
        worker: str = "",
        attempts: int | None = None,
    ) -> None:
        """Record that a message still stored ends now as ``outcome`` (``attempts``: its
        attempts as Redis keeps them, when this store already changed its meta record)."""
        if self._limits.outcome_ms:
            now = self._now()
            retention = self._limits.outcome_ms
            outcomes.record_end(
                state,
                message_id,
                outcome,
                at=now,
                now=now,
                retention_ms=retention,
                worker=worker,
                attempts=attempts,
            )

    def _end_dead(self, state: QueueState, message_id: str) -> None:
        """Record the end of a dead letter about to be deleted (still in garbage)."""
        if self._limits.outcome_ms:
            now = self._now()
            outcome, at = outcomes.dead_end(state, message_id, now)
            retention = self._limits.outcome_ms
            outcomes.record_end(state, message_id, outcome, at=at, now=now, retention_ms=retention)

    def _return_to_waiting(
        self, state: QueueState, message_id: str, delivered_attempt: int | None = None
    ) -> bool:
        """key_index.return_to_waiting, recording a superseded message as replaced, with
        the attempt of its delivery when the caller already gave it back (a release, a
        postpone): the scripts never rewrite a superseded message's meta record."""
        if self._limits.outcome_ms and key_index.superseded(state, message_id):
            self._end(state, message_id, REPLACED, attempts=delivered_attempt)
        return key_index.return_to_waiting(state, message_id)

    def ended(
        self, message_id: str | None = None, *, key: str | None = None
    ) -> StoredMessage | None:
        if message_id is None and key is None:
            raise ValueError("ended: give a message_id or a key")
        with self.server.lock:
            found, raw = outcomes.read(self._state(), self._now(), message_id, key)
        return ended_message(found, raw) if found else None

    def place(self, message_ids: list[str], keys: Sequence[str | None] | None = None) -> list[str]:
        """New ids as this store files them: as they are (one queue, one set of keys)."""
        return message_ids

    def subscribe_wakeups(self) -> MemoryWakeups:
        return MemoryWakeups(self.server, [self._channel])

    def subscribe_channels(self, channels: Sequence[str]) -> MemoryWakeups:
        """Listen on several queues' wake-up channels (a sharded queue's) of this server."""
        return MemoryWakeups(self.server, channels)
