"""An operator's reads and moves of a memory queue, as requeue.lua, promote.lua,
drop_garbage.lua, stats.lua, snapshot.lua, throughput.lua, totals.lua, list.lua and
peek.lua do them."""

from collections.abc import Mapping, Sequence
from typing import Any

from delayqueue_django.engine.history import last_of, parse_history
from delayqueue_django.engine.keyed import split_keyed
from delayqueue_django.engine.memory import groups, key_index, prelude
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.expiry import forget_flow
from delayqueue_django.engine.memory.server import Meta
from delayqueue_django.engine.records import STATES, Attempt, Attempts, StoredMessage, split_trace


class MemoryOperators(MemoryStoreBase):
    """Requeue, deliver now and drop garbage; stats, counts, pages and peeks."""

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        if not message_ids:
            return []
        with self.server.lock:
            state, now = self._state(), self._now()
            requeued = []
            for message_id in message_ids:
                # A keyed dead letter whose key has a newer waiting message stays dead.
                if message_id not in state.garbage or key_index.superseded(state, message_id):
                    continue
                old = state.metas.get(message_id)
                lease, budget = (0, default_budget) if old is None else (old.lease, old.budget)
                state.metas[message_id] = Meta(lease + 1, 0, budget, now)
                state.garbage.remove(message_id)
                state.exhausted.remove(message_id)
                state.pending.add(message_id, now)
                key_index.take_key(state, message_id)
                # A new life: no expiry, postpones or dead reason (requeue.lua).
                forget_flow(state, message_id)
                requeued.append(message_id)
            if requeued:
                self._wake(now)
            return requeued

    def promote(self, message_ids: Sequence[str]) -> list[str]:
        if not message_ids:
            return []
        with self.server.lock:
            state, now = self._state(), self._now()
            promoted = []
            for message_id in message_ids:
                if message_id in state.pending:
                    groups.unpark(state, message_id)
                    state.pending.add(message_id, now)
                    state.metas[message_id].due = now
                    promoted.append(message_id)
            if promoted:
                self._wake(now)
            return promoted

    def drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        limit: int,
        keep_unannounced: bool,
        offset: int = 0,
        buried_before_ms: int | None = None,
    ) -> tuple[int, int]:
        with self.server.lock:
            state = self._state()
            if buried_before_ms is not None:
                # (scores are whole ms: "before" is "at most one ms less")
                candidates = state.garbage.upto(buried_before_ms - 1, offset + limit)[offset:]
            elif older_than_ms is None or older_than_ms < 0:
                candidates = state.garbage.page(offset, limit)
            else:
                cutoff = self._now() - older_than_ms
                candidates = state.garbage.upto(cutoff, offset + limit)[offset:]
            dropped = 0
            for message_id, _ in candidates:
                if keep_unannounced and message_id in state.exhausted:
                    continue
                state.garbage.remove(message_id)
                prelude.forget(state, message_id)
                dropped += 1
            return dropped, len(candidates) - dropped

    def stats(self) -> dict[str, int]:
        with self.server.lock:
            state, now = self._state(), self._now()
            # (Parked messages count as due, but are no one's next due time nor lag: see
            # stats.lua.)
            head = state.pending.head()
            next_due = -1 if head is None or head[1] >= groups.PARKED else head[1]
            parked = len(state.pending) - state.pending.count_upto(groups.PARKED - 1)
            # The next of each staging list counts too (staged_lag in stats.lua).
            waited = [
                now - state.metas[queued[0]].due
                for queued in (state.ready, state.retry)
                if queued and 0 < state.metas[queued[0]].due <= now
            ]
            return {
                "pending": len(state.pending),
                "ready": len(state.ready),
                "unack": len(state.unack),
                "retry": len(state.retry),
                "garbage": len(state.garbage),
                "due": state.pending.count_upto(now) + parked,
                "unannounced": len(state.exhausted),
                "server_time_ms": now,
                "next_due_ms": next_due,
                "lag_ms": max([now - next_due if 0 <= next_due <= now else 0, *waited]),
                **{
                    f"{name}_total": state.totals.get(name, 0)
                    for name in (
                        *("acked", "failed", "retried", "timed_out", "exhausted"),
                        "superseded",
                        *("expired", "postponed"),
                    )
                },
                "paused": int(state.paused),
            }

    def snapshot(self) -> list[Any]:
        """Every id the queue holds, in the reply shape of snapshot.lua (see invariants)."""
        with self.server.lock:
            state = self._state()
            flat_metas = []
            for message_id, meta in state.metas.items():
                flat_metas += [message_id, f"{meta.lease}:{meta.attempt}:{meta.budget}:{meta.due}"]
            return [
                [member for member, _ in state.pending.ordered()],
                list(state.ready),
                [member for member, _ in state.unack.ordered()],
                list(state.retry),
                [member for member, _ in state.garbage.ordered()],
                list(state.payloads),
                flat_metas,
                [member for member, _ in state.exhausted.ordered()],
                [],  # nothing can hold a foreign type here, so nothing is quarantined
                [],
                [part for pair in state.keys.items() for part in pair],
                [
                    part
                    for message_id in state.payloads
                    if (key := key_index.key_of(state, message_id)) is not None
                    for part in (message_id, key)
                ],
                list(state.history),
                [],
            ]

    def unreadable_payloads(self) -> list[Any]:
        return []  # its payloads are what send was given: text

    def throughput(self, minutes: int) -> list[tuple[int, int, int]]:
        with self.server.lock:
            state = self._state()
            current = self._now() // 60_000
            return [
                (
                    minute * 60_000,
                    state.throughput.get((minute, "acked"), 0),
                    state.throughput.get((minute, "failed"), 0),
                )
                for minute in range(current - minutes + 1, current + 1)
            ]

    def add_totals(self, increments: Mapping[str, int]) -> None:
        with self.server.lock:
            state = self._state()
            for name, count in increments.items():
                prelude.count_total(state, name, count)

    def totals(self) -> dict[str, int]:
        with self.server.lock:
            return dict(self._state().totals)

    def prune_throughput(self, keep_minutes: int) -> int:
        with self.server.lock:
            state = self._state()
            oldest_kept = self._now() // 60_000 - keep_minutes + 1
            old = [field for field in state.throughput if field[0] < oldest_kept]
            for field in old:
                del state.throughput[field]
            return len(old)

    def list(
        self, state: str, *, offset: int, limit: int, preview_bytes: int
    ) -> list[StoredMessage]:
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; the states are {', '.join(STATES)}")
        with self.server.lock:
            queue = self._state()
            entries: list[tuple[str, int | None]]
            if state in ("ready", "retry"):
                staged = queue.ready if state == "ready" else queue.retry
                entries = [
                    (message_id, None) for message_id in prelude.staged_slice(staged, offset, limit)
                ]
            else:
                scored = {"pending": queue.pending, "unack": queue.unack}.get(state, queue.garbage)
                entries = list(scored.page(offset, limit))
            return [
                prelude.stored(queue, message_id, state, score, preview_bytes=preview_bytes)
                for message_id, score in entries
            ]

    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        with self.server.lock:
            return prelude.peek(self._state(), message_id, preview_bytes)

    def peek_payload(self, message_id: str) -> bytes | None:
        with self.server.lock:
            payload = self._state().payloads.get(message_id)
        if payload is None:
            return None
        return split_trace(split_keyed(payload)[2])[1].encode("utf-8")

    def held(self, message_ids: Sequence[str]) -> set[str]:
        with self.server.lock:
            payloads = self._state().payloads
            return {message_id for message_id in message_ids if message_id in payloads}

    def history(self, message_id: str) -> Attempts:
        with self.server.lock:
            return parse_history(self._state().history.get(message_id))

    def last_errors(self, message_ids: Sequence[str]) -> dict[str, Attempt]:
        with self.server.lock:
            history = self._state().history
            found = {i: last_of(history.get(i)) for i in message_ids}
        return {i: attempt for i, attempt in found.items() if attempt is not None}
