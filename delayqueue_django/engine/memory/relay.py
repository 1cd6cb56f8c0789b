"""The outbox relay's writes to a memory queue, as relay.lua does them: each message
written once, however often it is relayed; a keyed one decided by its key as send_keyed
decides it."""

from collections.abc import Sequence

from delayqueue_django.engine.keyed import check_relayable
from delayqueue_django.engine.memory import expiry, groups, metrics
from delayqueue_django.engine.memory.keyed import MemoryKeyed
from delayqueue_django.engine.memory.server import Meta, SentRecord
from delayqueue_django.engine.metrics import Counts
from delayqueue_django.engine.records import NewMessage

# As relay.lua: ids relayed longer ago than keep_ms are dropped, this many per call.
RELAY_PRUNE_LIMIT = 100


class MemoryRelay(MemoryKeyed):
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
        for message in batch:
            if message.at_ms is None:
                raise ValueError(f"a relayed message needs its due time (id {message.id!r})")
            check_relayable(message)
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            for message_id in forget:
                state.relayed.remove(message_id)
            for message_id, _ in state.relayed.upto(now - keep_ms, RELAY_PRUNE_LIMIT):
                state.relayed.remove(message_id)
            previous_head = state.pending.head()
            dues: list[int | None] = []
            taken: set[str] = set()
            grouped: list[tuple[str, str]] = []
            # The keyed messages to decide, in order, and each one's place in the reply.
            keyed: list[NewMessage] = []
            keyed_at: list[int] = []
            for message in batch:
                message_id = message.id
                noted = message_id in state.relayed
                # As relay.lua: keep_ms counts from the last time a row brought the id.
                state.relayed.add(message_id, now)
                known = message_id in state.metas or message_id in state.payloads
                if noted or known or message_id in taken:
                    dues.append(None)
                    continue
                taken.add(message_id)
                if message.key is not None:
                    keyed_at.append(len(dues))
                    keyed.append(message)
                    dues.append(None)
                    continue
                assert message.at_ms is not None  # checked above
                due = max(message.at_ms, now)
                state.pending.add(message_id, due)
                state.payloads[message_id] = message.payload
                state.metas[message_id] = Meta(0, 0, message.budget, due)
                if message.group is not None:
                    grouped.append((message_id, message.group))
                # Never refused: one relayed too late expires as it is staged (relay.lua).
                expiry.set_expiry(state, message_id, message.expires_at_ms)
                dues.append(due)
                if self.server.sent is not None:
                    self.server.sent.append(SentRecord(self._keys.queue, message, due, now))
            if keyed:
                sent, _ = self._write_keyed(state, keyed, now, now_us, refuse_early=False)
                for position, outcome in zip(keyed_at, sent, strict=True):
                    # Created, or the key's waiting message replaced: written. Kept or held: not.
                    if outcome.outcome in ("created", "replaced"):
                        dues[position] = outcome.due_ms
            # After the keyed ones, as relay.lua numbers them.
            for message_id, group in grouped:
                groups.record(state, message_id, group)
            written = [due for due in dues if due is not None]
            metrics.count_minute(state, now, Counts(sent=len(written)))
            if written and (previous_head is None or min(written) < previous_head[1]):
                self._wake(min(written))
            return dues
