"""A message's way through a memory queue, as send.lua, fetch.lua, ack.lua, nack.lua,
release.lua, extend.lua, claim_exhausted.lua, confirm_exhausted.lua and remove.lua do it."""

import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from delayqueue_django.engine.errors import DuplicateMessageId
from delayqueue_django.engine.flow import GATES_OWN
from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.keyed import split_keyed
from delayqueue_django.engine.memory import expiry, flow, groups, key_index, prelude
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.history import record_attempt
from delayqueue_django.engine.memory.server import Meta, QueueState, SentRecord
from delayqueue_django.engine.records import (
    EXPIRED,
    LEASE_EXPIRED,
    POSTPONED_TOO_OFTEN,
    Delivery,
    ExhaustedClaim,
    FetchResult,
    NackOutcome,
    NewMessage,
)


class MemoryDelivery(MemoryStoreBase):
    """Sending, fetching and the verdicts, and removing one message."""

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
            expiries = expiry.refuse_early_expiries(
                batch,
                [
                    None if replay else self._due_of(message, now, now_us)
                    for message, replay in zip(batch, replayed, strict=True)
                ],
                now,
                now_us,
                self._keys.queue,
            )
            previous_head = state.pending.head()
            dues = []
            for message, replay, expires in zip(batch, replayed, expiries, strict=True):
                if replay:
                    dues.append(prelude.replayed_due(state, message.id, now))
                    continue
                due = self._due_of(message, now, now_us)
                expiry.set_expiry(state, message.id, expires)
                state.pending.add(message.id, due)
                state.payloads[message.id] = message.payload
                state.metas[message.id] = Meta(0, 0, message.budget, due)
                if message.group is not None:
                    groups.record(state, message.id, message.group)
                dues.append(due)
                if self.server.sent is not None:
                    self.server.sent.append(SentRecord(self._keys.queue, message, due, now))
            written = [due for due, replay in zip(dues, replayed, strict=True) if not replay]
            if written and (previous_head is None or min(written) < previous_head[1]):
                self._wake(min(written))
            return dues

    @staticmethod
    def _due_of(message: NewMessage, now: int, now_us: int) -> int:
        if message.at_ms is None:
            return prelude.due_after(now, now_us, *divmod(message.delay_us, 1000))
        return max(message.at_ms, now)  # a time already past is due now (see send.lua)

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
                grouped = message_id in state.group_of
                prelude.forget(state, message_id)
                if grouped:
                    self._wake(self._now())  # its group may have passed on (groups.py)
            return removed

    # Consumers

    def fetch(
        self,
        count: int,
        *,
        fetcher: str = "",
        request: str = "",
        gates: str = GATES_OWN,
        leased_from: int | None = None,
        gated: bool = False,
    ) -> FetchResult:
        with self.server.lock:
            state, (now, now_us) = self._state(), self._now_with_us()
            read_at = time.monotonic()
            deadline = (now if leased_from is None else leased_from) + self._limits.consume_ms
            last = state.fetches.pop(fetcher, None) if request else None
            again, unreserved, capped = None, False, False
            if last is not None and last[0] == request and last[2] > now:
                deliveries = self._hand_out_again(state, last[1], deadline)
                expired = 0
            else:
                # The flow gates (see fetch.lua and memory/flow.py).
                allowed, again, unreserved, capped = flow.gate(
                    state, self._limits, count, now, gates
                )
                deliveries, expired = self._take_due(state, now, allowed, deadline)
                flow.record(state, self._limits, len(deliveries), now, gates)
                if allowed < count and len(deliveries) == allowed:
                    deliveries = [replace(d, due_ms=max(d.due_ms, now)) for d in deliveries]
            if request and deliveries:
                handed = [(delivery.id, delivery.lease) for delivery in deliveries]
                state.fetches[fetcher] = (request, handed, deadline)
            # (A count the reservation bound wakes no peer when all of it went out: 0.)
            wakes_at = 0 if gated else count
            result = self._fetched(state, now, now_us, read_at, wakes_at, deliveries, expired)
            if unreserved:
                result = replace(result, unreserved=True)
            if again is not None and result.next_ms == now:
                return replace(result, next_ms=again, capped=capped)
            return result

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

        # 1. Deliveries that outlived their deadline: retry, or garbage when used up; each
        # leaves a record of its attempt (see fetch.lua).
        expired = 0
        for message_id, passed in state.unack.pop_upto(now, room()):
            meta = state.metas[message_id]
            expired += 1
            lapsed = [meta.attempt, LEASE_EXPIRED, "", "", "", "", None, passed, ""]
            record_attempt(state, message_id, lapsed, self._limits.history_attempts)
            # Its redelivery is due from the moment the deadline passed.
            meta.lease, meta.due = meta.lease + 1, passed
            if meta.attempt > meta.budget:
                prelude.bury(state, message_id, now)
            elif key_index.return_to_waiting(state, message_id):
                prelude.count_total(state, "retried", 1)
                if expiry.expired(state, message_id, now):
                    expiry.bury_for(state, message_id, now, EXPIRED, "expired")
                else:
                    state.retry.append(message_id)
        prelude.count(state, now, "failed", expired)
        prelude.count_total(state, "timed_out", expired)

        # 2. Pending messages whose time has come.
        due = []
        for message_id, score in state.pending.pop_upto(now, room()):
            if expiry.expired(state, message_id, now):
                expiry.bury_for(state, message_id, now, EXPIRED, "expired")
            else:
                due.append((message_id, score))
        # Ordered groups: what must wait for its group is parked (see memory/groups.py).
        passing = groups.pass_groups(state, due) if state.group_of else [i for i, _ in due]
        for message_id in passing:
            target = state.retry if state.metas[message_id].attempt > 0 else state.ready
            target.append(message_id)

        # 3. Hand out, redeliveries first: they have waited longest.
        deliveries: list[Delivery] = []
        for source in (state.retry, state.ready):
            while source and len(deliveries) < count:
                message_id = source.popleft()
                if expiry.expired(state, message_id, now):
                    expiry.bury_for(state, message_id, now, EXPIRED, "expired")
                    continue
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
        self,
        leases: Sequence[tuple[str, int]],
        *,
        fetcher: str = "",
        request: str = "",
        plain: bool = False,  # (nothing to save here: the key pointer is dropped by id)
        untracked: bool = False,  # (likewise: prelude.forget drops them by id)
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
                    prelude.forget(state, message_id)
                    acked.append(message_id)
            prelude.count(state, now, "acked", len(acked))
            if acked and state.group_of:
                self._wake(now)  # a group passed on: its next message is due (groups.py)
            self._record(state, fetcher, request, frozenset(acked), len(acked), now)
            return set(acked)

    def nack(
        self,
        refusals: Sequence[tuple[str, int, int]],
        *,
        fetcher: str = "",
        request: str = "",
        postponed: Collection[str] = (),
        max_postpones: int = 0,
        attempts: Mapping[str, AttemptNote] | None = None,
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
            postponed_back = 0
            for message_id, lease, delay_ms in refusals:
                if not prelude.holds(state, message_id, lease):
                    continue
                state.unack.remove(message_id)
                meta = state.metas[message_id]
                meta.lease += 1
                note = (attempts or {}).get(message_id)
                attempt = meta.attempt
                postpone = message_id in postponed
                if postpone:
                    # Not an attempt: the one its delivery counted is given back (nack.lua).
                    meta.attempt = max(meta.attempt - 1, 0)
                    state.postpones[message_id] = state.postpones.get(message_id, 0) + 1
                due = prelude.due_after(now, now_us, delay_ms, 0)
                if (meta.attempt > meta.budget and not postpone) or delay_ms < 0:
                    prelude.bury(state, message_id, now)
                    outcomes.append(NackOutcome(message_id, True, now))
                elif postpone and state.postpones[message_id] > max_postpones:
                    expiry.bury_for(state, message_id, now, POSTPONED_TOO_OFTEN, "exhausted")
                    outcomes.append(
                        NackOutcome(message_id, True, now, dead_reason=POSTPONED_TOO_OFTEN)
                    )
                elif expiry.expired(state, message_id, due):
                    postponed_back += postpone
                    expiry.bury_for(state, message_id, now, EXPIRED, "expired")
                    outcomes.append(NackOutcome(message_id, True, now, dead_reason=EXPIRED))
                elif not key_index.return_to_waiting(state, message_id):
                    postponed_back += postpone
                    outcomes.append(NackOutcome(message_id, False, now, superseded=True))
                else:
                    postponed_back += postpone
                    meta.due = due
                    state.pending.add(message_id, meta.due)
                    prelude.count_total(state, "retried", 1)
                    earliest = meta.due if earliest is None else min(earliest, meta.due)
                    outcomes.append(NackOutcome(message_id, False, meta.due))
                outcome = outcomes[-1]
                if note is not None and not outcome.superseded:
                    verdict = outcome.dead_reason or note.verdict
                    record = note.record(attempt, verdict, now)
                    record_attempt(state, message_id, record, self._limits.history_attempts)
            if earliest is not None and (previous_head is None or earliest < previous_head[1]):
                self._wake(earliest)
            if state.group_of and any(o.exhausted or o.superseded for o in outcomes):
                self._wake(now)  # a group passed on: its next message is due (groups.py)
            # A postpone is no failure.
            prelude.count(state, now, "failed", len(outcomes) - postponed_back)
            prelude.count_total(state, "postponed", postponed_back)
            self._record(state, fetcher, request, tuple(outcomes), len(outcomes), now)
            return outcomes

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        if not leases:
            return []
        with self.server.lock:
            state = self._state()
            released: deque[str] = deque()
            superseded = False
            # Walk backwards and push to the front, so the first id given ends up first.
            for message_id, lease in reversed(leases):
                if not prelude.holds(state, message_id, lease):
                    continue
                state.unack.remove(message_id)
                meta = state.metas[message_id]
                meta.lease, meta.attempt = meta.lease + 1, meta.attempt - 1
                if not key_index.return_to_waiting(state, message_id):
                    superseded = True  # gone, so not handed back (its group passed on)
                    continue
                (state.retry if meta.attempt > 0 else state.ready).appendleft(message_id)
                released.appendleft(message_id)
            if released or (superseded and state.group_of):
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
                key, _, payload = split_keyed(state.payloads.get(message_id) or "")
                claims.append(
                    ExhaustedClaim(
                        message_id,
                        payload if message_id in state.payloads else None,
                        0 if meta is None else meta.attempt,
                        claimed_until,
                        key,
                        reason=state.dead_reasons.get(message_id, ""),
                        group=groups.group_of(state, message_id),
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
