"""Keyed messages on a memory queue, as send_keyed.lua, lookup.lua, reschedule.lua and
remove.lua's cancel by key do them (the semantics are the keys design's, engine/keyed.py)."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from delayqueue_django.engine.errors import DuplicateKey
from delayqueue_django.engine.keyed import keyed_body, split_keyed
from delayqueue_django.engine.memory import expiry, groups, key_index, prelude
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.server import Meta, QueueState, SentRecord
from delayqueue_django.engine.records import KeyedSent, NewMessage, StoredMessage


@dataclass(frozen=True, slots=True)
class _Decision:
    """What one message of a batch does: its outcome and the id it names."""

    outcome: str  # "replay", "kept", "replaced", "held" or "created"
    message_id: str


class MemoryKeyed(MemoryStoreBase):
    """Sends that carry a key, and finding, cancelling and rescheduling by key."""

    def send_keyed(self, messages: Sequence[NewMessage]) -> list[KeyedSent]:
        sent: list[KeyedSent] = []
        size = self._limits.send_batch_size
        # Batch by batch, as RedisStore sends them: each batch is written whole or not at all.
        for start in range(0, len(messages), size):
            sent += self._send_keyed_batch(messages[start : start + size])
        return sent

    def _send_keyed_batch(self, batch: Sequence[NewMessage]) -> list[KeyedSent]:
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            previous_head = state.pending.head()
            sent, earliest = self._write_keyed(state, batch, now, now_us)
            if earliest is not None and (previous_head is None or earliest < previous_head[1]):
                self._wake(earliest)
            return sent

    def _write_keyed(
        self,
        state: QueueState,
        batch: Sequence[NewMessage],
        now: int,
        now_us: int,
        *,
        refuse_early: bool = True,
    ) -> tuple[list[KeyedSent], int | None]:
        """Decide and write a batch of keyed messages (the lock held; send_keys in the
        prelude of the scripts); returns each one's KeyedSent and the earliest due time
        written (None when none)."""
        key_index.reclaim_holds(state, now)
        # Every decision is taken before anything is written, so that a refusal
        # (if_exists="error", an expiry before the due time) leaves no trace of its batch.
        # (A relay refuses nothing: ``refuse_early`` False, see relay.lua.)
        dues = [self._due(message, now, now_us) if refuse_early else None for message in batch]
        expiries = expiry.refuse_early_expiries(batch, dues, now, now_us, self._keys.queue)
        remembered: key_index.KeyRows = {}
        decisions = self._decide(state, batch, remembered)
        state.key_rows.update(remembered)
        earliest: int | None = None
        sent = []
        for message, decision, expires in zip(batch, decisions, expiries, strict=True):
            due: int | None
            if decision.outcome in ("created", "replaced"):
                due = self._due(message, now, now_us)
                if decision.outcome == "created":
                    self._create(state, message, due, now)
                elif self._replace(state, decision.message_id, message, due, now):
                    self._wake(now)  # its old group passed on: its next message is due
                # A replace without an expiry drops the one the message had (send_keyed.lua).
                expiry.set_expiry(state, decision.message_id, expires)
                earliest = due if earliest is None else min(earliest, due)
                if self.server.sent is not None:
                    record = replace(message, id=decision.message_id)
                    self.server.sent.append(SentRecord(self._keys.queue, record, due, now))
            else:
                if decision.outcome == "replay" and expires is not None:
                    expiry.set_expiry(state, decision.message_id, expires)
                due = self._waiting_due(state, decision.message_id)
            outcome = "created" if decision.outcome == "replay" else decision.outcome
            sent.append(KeyedSent(decision.message_id, outcome, due))
        return sent, earliest

    def _decide(
        self, state: QueueState, batch: Sequence[NewMessage], remembered: key_index.KeyRows
    ) -> list[_Decision]:
        """Each message's decision, in order, each seeing the earlier ones' effect (their
        new ids, the keys they took, the holds they started, the outbox rows they left in
        ``remembered``); raises DuplicateKey for the first ``error`` that meets a waiting
        message or a hold."""
        new_ids: set[str] = set()
        taken: dict[str, str] = {}  # key -> the id an earlier message of the batch created
        held: dict[str, str] = {}  # key -> its holder, from an earlier message
        decisions = []
        for message in batch:
            key = message.key
            if key is None:
                raise ValueError(f"a keyed send needs a key (message {message.id!r})")
            if message.id in new_ids or message.id in state.payloads or message.id in state.metas:
                # A replay of a send whose reply was lost: acknowledged, written once.
                decisions.append(_Decision("replay", message.id))
                continue
            waiting = taken.get(key) or key_index.waiting_message(state, key)
            holder = held.get(key) or key_index.live_holder(state, key)
            row = message.outbox_row
            if waiting is not None:
                if message.if_exists == "error":
                    raise DuplicateKey(key, waiting)
                # A replace row older than one of its database that wrote the waiting
                # message keeps it (see "Outbox rows" in _prelude.lua).
                replacing = message.if_exists == "replace" and not key_index.overtaken(
                    state, remembered, key, waiting, row
                )
                if replacing and row is not None:
                    key_index.remember(state, remembered, key, waiting, row)
                decisions.append(_Decision("replaced" if replacing else "kept", waiting))
            elif holder is not None:
                if message.if_exists == "error":
                    raise DuplicateKey(key, holder, held=True)
                decisions.append(_Decision("held", holder))
            else:
                decisions.append(_Decision("created", message.id))
                new_ids.add(message.id)
                taken[key] = message.id
                if row is not None and message.if_exists == "replace":
                    key_index.remember(state, remembered, key, message.id, row)
                if message.unique_ms > 0:
                    held[key] = message.id
        return decisions

    @staticmethod
    def _due(message: NewMessage, now: int, now_us: int) -> int:
        if message.at_ms is None:
            return prelude.due_after(now, now_us, *divmod(message.delay_us, 1000))
        return max(message.at_ms, now)  # a time already past is due now (see send.lua)

    @staticmethod
    def _create(state: QueueState, message: NewMessage, due: int, now: int) -> None:
        key = message.key
        assert key is not None  # checked by _decide
        state.pending.add(message.id, due)
        state.payloads[message.id] = keyed_body(key, now, message.payload)
        state.metas[message.id] = Meta(0, 0, message.budget, due)
        state.keys[key] = message.id
        state.keys_used = True
        if message.unique_ms > 0:
            key_index.start_hold(state, key, message.id, now + message.unique_ms)
        if message.group is not None:
            groups.record(state, message.id, message.group)

    @staticmethod
    def _replace(
        state: QueueState, message_id: str, message: NewMessage, due: int, now: int
    ) -> bool:
        """The waiting message gets the new payload, due time and budget, and a new
        generation; its attempts start again, its attempt records gone (its lease stays: a
        stale verdict of an older delivery never matches it); taken out of a staging list
        back to pending. It leaves its ordered group and joins the send's, as the latest
        send (regroup in _prelude.lua); True when it held its old group, which passed on."""
        key, generation, _ = split_keyed(state.payloads[message_id])
        assert key is not None  # only a keyed message is a key's
        state.payloads[message_id] = keyed_body(key, max(now, generation + 1), message.payload)
        meta = state.metas[message_id]
        meta.attempt, meta.budget, meta.due = 0, message.budget, due
        state.history.pop(message_id, None)  # its attempts start again: their records go
        prelude.take_out_of_waiting(state, message_id)
        state.pending.add(message_id, due)
        old_group = groups.group_of(state, message_id)
        held = old_group is not None and state.group_busy.get(old_group) == message_id
        groups.leave(state, message_id)
        if message.group is not None:
            groups.record(state, message_id, message.group)
        return held

    @staticmethod
    def _waiting_due(state: QueueState, message_id: str) -> int | None:
        """A message's due time while it waits (its pending score, else when it became due:
        it is staged), None when it is in flight, dead or no longer stored."""
        if not key_index.is_waiting(state, message_id):
            return None
        score = state.pending.score(message_id)
        return score if score is not None else state.metas[message_id].due

    def lookup(self, key: str) -> StoredMessage | None:
        with self.server.lock:
            state = self._state()
            message_id = state.keys.get(key)
            return None if message_id is None else prelude.peek(state, message_id, None)

    def holds_key(self, key: str) -> bool:
        with self.server.lock:
            state = self._state()
            key_index.reclaim_holds(state, self._now())
            return key in state.keys or key_index.live_holder(state, key) is not None

    def keys_used(self) -> bool:
        with self.server.lock:
            return self._state().keys_used

    def stored_keys(self) -> Iterator[str]:
        with self.server.lock:
            return iter(list(self._state().keys))

    def cancel_key(self, key: str) -> str | None:
        with self.server.lock:
            state = self._state()
            message_id = key_index.waiting_message(state, key)
            if message_id is None:
                return None
            grouped = message_id in state.group_of
            prelude.take_out_of_waiting(state, message_id)
            prelude.forget(state, message_id)
            if grouped:
                self._wake(self._now())  # its group may have passed on (groups.py)
            return message_id

    def reschedule(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        at_ms: int | None = None,
        delay_us: int = 0,
    ) -> int | None:
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            if key is not None:
                message_id = key_index.waiting_message(state, key)
            if message_id is None or not key_index.is_waiting(state, message_id):
                return None
            if at_ms is None:
                due = prelude.due_after(now, now_us, *divmod(delay_us, 1000))
            else:
                due = max(at_ms, now)
            previous_head = state.pending.head()
            prelude.take_out_of_waiting(state, message_id)
            state.pending.add(message_id, due)
            state.metas[message_id].due = due
            if previous_head is None or due < previous_head[1]:
                self._wake(due)
            return due
