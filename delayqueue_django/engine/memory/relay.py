"""The outbox relay's writes to a memory queue, as relay.lua does them: each message
written once, however often it is relayed."""

from collections.abc import Sequence

from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.server import Meta, SentRecord
from delayqueue_django.engine.records import NewMessage

# As relay.lua: ids relayed longer ago than keep_ms are dropped, this many per call.
RELAY_PRUNE_LIMIT = 100


class MemoryRelay(MemoryStoreBase):
    """Relayed sends, each noted so that a repeat writes nothing."""

    def relay(
        self, messages: Sequence[NewMessage], *, forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        dues: list[int | None] = []
        size = self._limits.send_batch_size
        # Batch by batch, as RedisStore relays them; the first call forgets (see relay.lua).
        for start in range(0, max(len(messages), 1), size):
            batch = messages[start : start + size]
            dues += self._relay_batch(batch, forget if start == 0 else (), keep_ms)
        return dues

    def _relay_batch(
        self, batch: Sequence[NewMessage], forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        with self.server.lock:
            state, now = self._state(), self._now()
            for message_id in forget:
                state.relayed.remove(message_id)
            for message_id, _ in state.relayed.upto(now - keep_ms, RELAY_PRUNE_LIMIT):
                state.relayed.remove(message_id)
            previous_head = state.pending.head()
            dues: list[int | None] = []
            for message in batch:
                message_id = message.id
                noted = message_id in state.relayed
                # As relay.lua: keep_ms counts from the last time a row brought the id.
                state.relayed.add(message_id, now)
                if noted or message_id in state.metas or message_id in state.payloads:
                    dues.append(None)
                    continue
                if message.at_ms is None:
                    raise ValueError(f"a relayed message needs its due time (id {message_id!r})")
                due = max(message.at_ms, now)
                state.pending.add(message_id, due)
                state.payloads[message_id] = message.payload
                state.metas[message_id] = Meta(0, 0, message.budget, due)
                dues.append(due)
                if self.server.sent is not None:
                    self.server.sent.append(SentRecord(self._keys.queue, message, due, now))
            written = [due for due in dues if due is not None]
            if written and (previous_head is None or min(written) < previous_head[1]):
                self._wake(min(written))
            return dues
