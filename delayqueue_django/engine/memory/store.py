"""``MemoryStore``: one queue's whole life cycle in this process, with the semantics of the
Lua scripts.

Each method is the script of the same name (``engine/lua/*.lua``, whose headers document
the semantics) done in Python under the server's lock: the same states, leases, attempts and
budgets, due times handed out with deliveries, nack delays and burials, timeouts, releases,
the exhaustion announcements and their claims, the staging bounds, the throughput counts and
running totals, and the wake-ups; heartbeats and task results expire on its clock as Redis
keys do on Redis's. Nothing else can write to its structures, so the scripts' damage
handling (missing payloads or meta records, keys of the wrong type) has no counterpart here.

For tests and quick local runs: its messages live and die with the process and are invisible
to other processes.
"""

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from delayqueue_django.engine.errors import DuplicateMessageId
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.memory import prelude
from delayqueue_django.engine.memory.server import (
    MemoryServer,
    MemoryWakeups,
    Meta,
    QueueState,
    SentRecord,
    TickRecord,
)
from delayqueue_django.engine.records import (
    LONGEST_FAILURE_REASON,
    STATES,
    Delivery,
    ExhaustedClaim,
    FetchResult,
    NackOutcome,
    NewMessage,
    ScheduleFailure,
    ScheduleListing,
    ScheduleRecord,
    ScheduleReply,
    StoredMessage,
    StoreLimits,
    Tick,
    split_trace,
    tick_id,
)
from delayqueue_django.engine.shards import LAYOUTS_CHANGED

# As relay.lua: ids relayed longer ago than keep_ms are dropped, this many per call.
RELAY_PRUNE_LIMIT = 100


class MemoryStore:
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

    def place(self, message_ids: list[str]) -> list[str]:
        """New ids as this store files them: as they are (one queue, one set of keys)."""
        return message_ids

    # Producers

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        dues: list[int] = []
        size = self._limits.send_batch_size
        # Batch by batch, as RedisStore sends them: each batch is written whole or not at all.
        for start in range(0, len(messages), size):
            dues += self._send_batch(messages[start : start + size])
        return dues

    def _send_batch(self, batch: Sequence[NewMessage]) -> list[int]:
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            # The same id with the same payload is a replay of a send whose reply was lost
            # (see send.lua): acknowledged, written once. Decided per entry, as the script
            # does: an id given twice may be a replay once and a duplicate the other time.
            replayed = [state.payloads.get(m.id) == m.payload for m in batch]
            for message, replay in zip(batch, replayed, strict=True):
                if replay:
                    continue
                if message.id in state.metas or message.id in state.payloads:
                    raise DuplicateMessageId(
                        f"message id {message.id!r} already exists in queue "
                        f"{self._keys.queue!r}; nothing in its batch was written"
                    )
            previous_head = state.pending.head()
            dues = []
            for message, replay in zip(batch, replayed, strict=True):
                if replay:
                    dues.append(prelude.replayed_due(state, message.id, now))
                    continue
                if message.at_ms is None:
                    due = prelude.due_after(now, now_us, *divmod(message.delay_us, 1000))
                else:
                    # A time already past is due now (see send.lua).
                    due = max(message.at_ms, now)
                state.pending.add(message.id, due)
                state.payloads[message.id] = message.payload
                state.metas[message.id] = Meta(0, 0, message.budget, due)
                dues.append(due)
                if self.server.sent is not None:
                    self.server.sent.append(SentRecord(self._keys.queue, message, due, now))
            written = [due for due, replay in zip(dues, replayed, strict=True) if not replay]
            if written and (previous_head is None or min(written) < previous_head[1]):
                self._wake(min(written))
            return dues

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

    def remove(
        self,
        message_id: str,
        *,
        include_in_flight_and_dead: bool = False,
        only_from: str | None = None,
    ) -> str | None:
        with self.server.lock:
            state = self._state()
            removed = None

            def from_(name: str) -> bool:
                return only_from is None or only_from == name

            if from_("pending") and state.pending.remove(message_id):
                removed = "pending"
            elif from_("ready") and prelude.remove_first(state.ready, message_id):
                removed = "ready"
            elif from_("retry") and prelude.remove_first(state.retry, message_id):
                removed = "retry"
            elif include_in_flight_and_dead:
                if from_("garbage") and state.garbage.remove(message_id):
                    removed = "garbage"
                elif from_("unack") and state.unack.remove(message_id):
                    removed = "unack"
            if removed is not None:
                prelude.forget(state, message_id)
            return removed

    # Consumers

    def fetch(self, count: int, *, fetcher: str = "", request: str = "") -> FetchResult:
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            read_at = time.monotonic()
            deadline = now + self._limits.consume_ms
            last = state.fetches.pop(fetcher, None) if request else None
            if last is not None and last[0] == request and last[2] > now:
                deliveries = self._hand_out_again(state, last[1], deadline)
                expired = 0
            else:
                deliveries, expired = self._take_due(state, now, count, deadline)
            if request and deliveries:
                handed = [(delivery.id, delivery.lease) for delivery in deliveries]
                state.fetches[fetcher] = (request, handed, deadline)
            return self._fetched(state, now, now_us, read_at, count, deliveries, expired)

    def _hand_out_again(
        self, state: QueueState, handed: list[tuple[str, int]], deadline: int
    ) -> list[Delivery]:
        """A repeated request's deliveries still in unack under their lease (fetch.lua)."""
        deliveries = []
        for message_id, lease in handed:
            meta = state.metas.get(message_id)
            if meta is None or meta.lease != lease or message_id not in state.unack:
                continue
            meta.lease += 1
            state.unack.add(message_id, deadline)
            deliveries.append(prelude.delivery(state, message_id, meta, deadline))
        return deliveries

    def _take_due(
        self, state: QueueState, now: int, count: int, deadline: int
    ) -> tuple[list[Delivery], int]:
        stage_limit = self._limits.stage_limit

        def room() -> int:
            return stage_limit - len(state.ready) - len(state.retry)

        # 1. Deliveries that outlived their deadline: retry, or garbage when used up.
        expired = 0
        for message_id, passed in state.unack.pop_upto(now, room()):
            meta = state.metas[message_id]
            expired += 1
            # Its redelivery is due from the moment the deadline passed.
            meta.lease, meta.due = meta.lease + 1, passed
            if meta.attempt > meta.budget:
                prelude.bury(state, message_id, now)
            else:
                state.retry.append(message_id)
                prelude.count_total(state, "retried", 1)
        prelude.count(state, now, "failed", expired)
        prelude.count_total(state, "timed_out", expired)

        # 2. Pending messages whose time has come.
        for message_id, _ in state.pending.pop_upto(now, room()):
            target = state.retry if state.metas[message_id].attempt > 0 else state.ready
            target.append(message_id)

        # 3. Hand out, redeliveries first: they have waited longest.
        deliveries: list[Delivery] = []
        for source in (state.retry, state.ready):
            while source and len(deliveries) < count:
                message_id = source.popleft()
                meta = state.metas[message_id]
                meta.lease, meta.attempt = meta.lease + 1, meta.attempt + 1
                state.unack.add(message_id, deadline)
                deliveries.append(prelude.delivery(state, message_id, meta, deadline))
        return deliveries, expired

    def _fetched(
        self,
        state: QueueState,
        now: int,
        now_us: int,
        read_at: float,
        count: int,
        deliveries: list[Delivery],
        expired: int,
    ) -> FetchResult:
        # When to look again.
        next_ms: int | None = None
        pending_head, unack_head = state.pending.head(), state.unack.head()
        if (
            state.ready
            or state.retry
            or (pending_head is not None and pending_head[1] <= now)
            or (unack_head is not None and unack_head[1] <= now)
        ):
            next_ms = now
            if count > 0 and len(deliveries) == count:
                self._wake(now)

        # An exhaustion to announce now, or a claim that lapses later.
        exhausted_head = state.exhausted.head()
        owed = exhausted_head is not None and exhausted_head[1] <= now
        if next_ms is None:
            later = [
                head[1]
                for head in (pending_head, unack_head, exhausted_head)
                if head is not None and head[1] > now
            ]
            next_ms = min(later, default=None)

        return FetchResult(
            now_ms=now,
            next_ms=next_ms,
            expired=expired,
            deliveries=deliveries,
            exhaustions_owed=owed,
            now_us=now_us,
            read_at=read_at,
        )

    def _recorded(self, state: QueueState, fetcher: str, request: str, now: int) -> Any:
        """The recorded reply of a repeated ack or nack request, or None ("Lost replies" in
        _prelude.lua)."""
        record = state.commits.get(fetcher) if request else None
        if record is None or record[0] != request or record[2] <= now:
            return None
        return record[1]

    def _record(
        self, state: QueueState, fetcher: str, request: str, reply: Any, changed: int, now: int
    ) -> None:
        if request and changed:
            state.commits[fetcher] = (request, reply, now + self._limits.consume_ms)

    def ack(
        self, leases: Sequence[tuple[str, int]], *, fetcher: str = "", request: str = ""
    ) -> set[str]:
        if not leases:
            return set()
        with self.server.lock:
            state, now = self._state(), self._now()
            replayed = self._recorded(state, fetcher, request, now)
            if replayed is not None:
                return set(replayed)
            acked: list[str] = []
            for message_id, lease in leases:
                if prelude.holds(state, message_id, lease):
                    state.unack.remove(message_id)
                    state.payloads.pop(message_id, None)
                    state.metas.pop(message_id, None)
                    acked.append(message_id)
            prelude.count(state, now, "acked", len(acked))
            self._record(state, fetcher, request, frozenset(acked), len(acked), now)
            return set(acked)

    def nack(
        self,
        refusals: Sequence[tuple[str, int, int]],
        *,
        fetcher: str = "",
        request: str = "",
    ) -> list[NackOutcome]:
        if not refusals:
            return []
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            replayed = self._recorded(state, fetcher, request, now)
            if replayed is not None:
                return list(replayed)
            previous_head = state.pending.head()
            earliest: int | None = None
            outcomes = []
            for message_id, lease, delay_ms in refusals:
                if not prelude.holds(state, message_id, lease):
                    continue
                state.unack.remove(message_id)
                meta = state.metas[message_id]
                meta.lease += 1
                if meta.attempt > meta.budget or delay_ms < 0:
                    prelude.bury(state, message_id, now)
                    outcomes.append(NackOutcome(message_id, True, now))
                else:
                    meta.due = prelude.due_after(now, now_us, delay_ms, 0)
                    state.pending.add(message_id, meta.due)
                    prelude.count_total(state, "retried", 1)
                    earliest = meta.due if earliest is None else min(earliest, meta.due)
                    outcomes.append(NackOutcome(message_id, False, meta.due))
            if earliest is not None and (previous_head is None or earliest < previous_head[1]):
                self._wake(earliest)
            prelude.count(state, now, "failed", len(outcomes))
            self._record(state, fetcher, request, tuple(outcomes), len(outcomes), now)
            return outcomes

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        if not leases:
            return []
        with self.server.lock:
            state = self._state()
            released: deque[str] = deque()
            # Walk backwards and push to the front, so the first id given ends up first.
            for message_id, lease in reversed(leases):
                if not prelude.holds(state, message_id, lease):
                    continue
                state.unack.remove(message_id)
                meta = state.metas[message_id]
                meta.lease, meta.attempt = meta.lease + 1, meta.attempt - 1
                (state.retry if meta.attempt > 0 else state.ready).appendleft(message_id)
                released.appendleft(message_id)
            if released:
                self._wake(self._now())
            return list(released)

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        if not leases:
            return 0, []
        with self.server.lock:
            state = self._state()
            deadline = self._now() + self._limits.consume_ms
            extended = []
            for message_id, lease in leases:
                if prelude.holds(state, message_id, lease):
                    state.unack.add(message_id, deadline)
                    extended.append(message_id)
            return deadline, extended

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        with self.server.lock:
            state, now = self._state(), self._now()
            claims = []
            claimed_until = now + claim_ms
            for message_id, _ in state.exhausted.upto(now, count):
                state.exhausted.add(message_id, claimed_until)
                meta = state.metas.get(message_id)
                claims.append(
                    ExhaustedClaim(
                        message_id,
                        state.payloads.get(message_id),
                        0 if meta is None else meta.attempt,
                        claimed_until,
                    )
                )
            return claims

    def confirm_exhausted(self, claims: Sequence[tuple[str, int]]) -> int:
        with self.server.lock:
            state = self._state()
            confirmed = 0
            for message_id, claimed_until in claims:
                # Only while it still holds this very claim (see confirm_exhausted.lua).
                if state.exhausted.score(message_id) == claimed_until:
                    confirmed += state.exhausted.remove(message_id)
            return confirmed

    def subscribe_wakeups(self) -> MemoryWakeups:
        return MemoryWakeups(self.server, [self._channel])

    def subscribe_channels(self, channels: Sequence[str]) -> MemoryWakeups:
        """Listen on several queues' wake-up channels (a sharded queue's) of this server."""
        return MemoryWakeups(self.server, channels)

    def layouts(self) -> set[int]:
        with self.server.lock:
            return set(self._state().layouts)

    def add_layout(self, layout: int) -> None:
        with self.server.lock:
            layouts = self._state().layouts
            if layout not in layouts:
                layouts.add(layout)
                self._wake(LAYOUTS_CHANGED)

    def retire_layout(self, layout: int) -> bool:
        with self.server.lock:
            layouts = self._state().layouts
            registered = layout in layouts
            layouts.discard(layout)
            return registered

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        if not message_ids:
            return []
        with self.server.lock:
            state, now = self._state(), self._now()
            requeued = []
            for message_id in message_ids:
                if message_id not in state.garbage:
                    continue
                old = state.metas.get(message_id)
                lease, budget = (0, default_budget) if old is None else (old.lease, old.budget)
                state.metas[message_id] = Meta(lease + 1, 0, budget, now)
                state.garbage.remove(message_id)
                state.exhausted.remove(message_id)
                state.pending.add(message_id, now)
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
            head = state.pending.head()
            next_due = -1 if head is None else head[1]
            return {
                "pending": len(state.pending),
                "ready": len(state.ready),
                "unack": len(state.unack),
                "retry": len(state.retry),
                "garbage": len(state.garbage),
                "due": state.pending.count_upto(now),
                "unannounced": len(state.exhausted),
                "server_time_ms": now,
                "next_due_ms": next_due,
                "lag_ms": now - next_due if 0 <= next_due <= now else 0,
                **{
                    f"{name}_total": state.totals.get(name, 0)
                    for name in ("acked", "failed", "retried", "timed_out", "exhausted")
                },
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
            queue = self._state()
            for name, scored in (
                ("pending", queue.pending),
                ("unack", queue.unack),
                ("garbage", queue.garbage),
            ):
                score = scored.score(message_id)
                if score is not None:
                    return prelude.stored(
                        queue, message_id, name, score, peeked=True, preview_bytes=preview_bytes
                    )
            for name, staged in (("ready", queue.ready), ("retry", queue.retry)):
                if message_id in staged:
                    return prelude.stored(
                        queue, message_id, name, None, peeked=True, preview_bytes=preview_bytes
                    )
            if message_id in queue.payloads or message_id in queue.metas:
                return prelude.stored(
                    queue, message_id, "unknown", None, peeked=True, preview_bytes=preview_bytes
                )
            return None

    def peek_payload(self, message_id: str) -> bytes | None:
        with self.server.lock:
            payload = self._state().payloads.get(message_id)
        return None if payload is None else split_trace(payload)[1].encode("utf-8")

    def held(self, message_ids: Sequence[str]) -> set[str]:
        with self.server.lock:
            payloads = self._state().payloads
            return {message_id for message_id in message_ids if message_id in payloads}

    # Schedules (schedule.lua, schedules.lua)

    def read_schedules(self) -> ScheduleListing:
        with self.server.lock:
            state = self._state()
            names = sorted(state.schedules.keys() | state.schedule_ticks.keys())
            return self._now(), [prelude.schedule_record(state, name) for name in names]

    def read_schedule(self, name: str) -> ScheduleRecord | None:
        with self.server.lock:
            state = self._state()
            if name not in state.schedules and name not in state.schedule_ticks:
                return None
            return prelude.schedule_record(state, name)

    def write_tick(self, name: str, fingerprint: str, tick: Tick) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            if record.paused:
                return prelude.schedule_reply("paused", record, now)
            if record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            if tick.at_ms <= record.cursor:
                return prelude.schedule_reply("behind", record, now)
            self._write_tick(state, name, record, tick)
            state.schedule_failures.pop(name, None)
            return prelude.schedule_reply("written", record, now)

    def define_schedule(
        self,
        name: str,
        definition: str,
        fingerprint: str,
        *,
        expect: str,
        start_ms: int,
        first: Tick | None,
    ) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            exists = record is not None or name in state.schedules
            if expect == "new" and exists:
                return prelude.schedule_reply("exists", record, now)
            if expect == "existing" and not exists:
                return prelude.schedule_reply("missing", record, now)
            state.schedules[name] = definition
            if record is not None and record.fingerprint == fingerprint:
                return prelude.schedule_reply("unchanged", record, now)
            if record is None:
                # New: ticks of a schedule of this name removed before are not its own.
                record = state.schedule_ticks[name] = TickRecord(fingerprint, since=start_ms)
            record.cursor = max(
                start_ms, prelude.drop_waiting_tick(state, name, record, due_too=False)
            )
            record.fingerprint = fingerprint
            if first is not None and first.at_ms > record.cursor and not record.paused:
                self._write_tick(state, name, record, first)
            state.schedule_failures.pop(name, None)
            return prelude.schedule_reply("defined", record, now)

    def pause_schedule(self, name: str, start_ms: int) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            record.cursor = max(
                start_ms, prelude.drop_waiting_tick(state, name, record, due_too=True)
            )
            record.paused = True
            return prelude.schedule_reply("paused", record, now)

    def resume_schedule(
        self, name: str, fingerprint: str, start_ms: int, first: Tick | None
    ) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            if record.paused and record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            if record.paused:
                record.paused, record.since = False, start_ms
                record.cursor = max(start_ms, record.cursor)
                if first is not None and first.at_ms > record.cursor:
                    self._write_tick(state, name, record, first)
            return prelude.schedule_reply("resumed", record, now)

    def remove_schedule(self, name: str, fingerprint: str = "") -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None and name not in state.schedules:
                return prelude.schedule_reply("missing", None, now)
            if record is not None and fingerprint and record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            prelude.remove_schedule(state, name, record)
            return prelude.schedule_reply("removed", record, now)

    def declare_schedule(self, name: str) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None and name not in state.schedules:
                return prelude.schedule_reply("missing", None, now)
            state.schedule_declared[name] = now
            return prelude.schedule_reply("declared", record, now)

    def retire_schedule(self, name: str, fingerprint: str, undeclared_ms: int) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None and name not in state.schedules:
                return prelude.schedule_reply("missing", None, now)
            if record is not None and fingerprint and record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            declared = state.schedule_declared.get(name)
            if declared is None or declared > now:
                state.schedule_declared[name] = now
                return prelude.schedule_reply("declared", record, now)
            if now - declared < undeclared_ms:
                return prelude.schedule_reply("declared", record, now)
            prelude.remove_schedule(state, name, record)
            return prelude.schedule_reply("removed", record, now)

    def report_schedule_failure(
        self, name: str, fingerprint: str, failure: ScheduleFailure
    ) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            if record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            reason = failure.reason[:LONGEST_FAILURE_REASON]
            state.schedule_failures[name] = ScheduleFailure(reason, failure.since_ms)
            return prelude.schedule_reply("failed", record, now)

    def _write_tick(self, state: QueueState, name: str, record: TickRecord, tick: Tick) -> None:
        """The tick as a message due at its time, and the cursor moved to it (schedule.lua's
        write_tick): an id still held by a message is not written over."""
        message_id = tick_id(name, tick.at_ms)
        if message_id not in state.payloads and message_id not in state.metas:
            head = state.pending.head()
            state.pending.add(message_id, tick.at_ms)
            state.payloads[message_id] = tick.payload
            state.metas[message_id] = Meta(0, 0, tick.budget, tick.at_ms)
            if head is None or tick.at_ms < head[1]:
                self._wake(tick.at_ms)
        if record.tick > 0:
            record.previous = record.tick
        record.cursor = record.tick = tick.at_ms

    # Task results (delayqueue_django.tasks)

    def write_result(
        self,
        result_id: str,
        fields: Mapping[str, str],
        *,
        unless_set: Mapping[str, str],
        ttl_seconds: int | None,
    ) -> dict[str, str]:
        with self.server.lock:
            now = self._now()
            record = {**self._live_result(result_id, now), **fields}
            for name, value in unless_set.items():
                record.setdefault(name, value)
            expires = None if ttl_seconds is None else now + ttl_seconds * 1000
            self._state().results[result_id] = (record, expires)
            return dict(record)

    def read_result(self, result_id: str) -> dict[str, str]:
        with self.server.lock:
            return dict(self._live_result(result_id, self._now()))

    def _live_result(self, result_id: str, now: int) -> dict[str, str]:
        results = self._state().results
        record, expires = results.get(result_id, ({}, None))
        if expires is not None and expires <= now:
            del results[result_id]
            return {}
        return record

    # Worker heartbeats

    def put_heartbeat(self, worker_id: str, details: str, ttl_ms: int) -> None:
        with self.server.lock:
            expires = self._now() + max(ttl_ms, 1)
            self._state().heartbeats[worker_id] = (details, expires)

    def drop_heartbeat(self, worker_id: str) -> None:
        with self.server.lock:
            self._state().heartbeats.pop(worker_id, None)

    def heartbeats(self) -> dict[str, str]:
        with self.server.lock:
            beats, now = self._state().heartbeats, self._now()
            for worker_id in [w for w, (_, expires) in beats.items() if expires <= now]:
                del beats[worker_id]
            return {worker_id: details for worker_id, (details, _) in beats.items()}
