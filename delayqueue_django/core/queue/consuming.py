"""``Queue``'s consumer API, for hand-written consumers as for the worker: fetch, then a
verdict for each message (ack, nack, bury, release), leases extended, and exhausted
messages' announcements claimed and confirmed."""

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delayqueue_django.core.attempts import note_for
from delayqueue_django.core.encoding import decode_payload, delay_in_ms
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue.base import QueueBase, _reaching_redis
from delayqueue_django.engine import BURY, Delivery, NackOutcome, loggable
from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.quick_records import quick
from delayqueue_django.engine.records import NACK, POSTPONE, REJECT, TRACE_MARK, split_trace

logger = logging.getLogger("delayqueue_django")

# Messages, built without Message's frozen __init__: the same Message (see quick_records).
_message = quick(Message)


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one fetch brought: messages, and when the queue next has work."""

    messages: list[Message]
    """The messages handed out, each leased to the caller."""
    now_ms: int
    """The Redis clock when the fetch ran, in ms (``now_us``: the microseconds past it)."""
    next_ms: int | None
    """``now_ms`` if more work is waiting; else the next due time or deadline; None if
    nothing is."""
    expired: int
    """How many deliveries this fetch found past their deadline: each is retried, or
    buried with no retry left."""
    exhaustions_owed: bool
    """An exhausted message's announcement is owed: ``claim_exhausted`` has work."""
    now_us: int = 0
    """The microseconds past ``now_ms``."""
    read_at: float = 0.0
    """``time.monotonic()`` of this process when the clock was read (the middle of the
    round trip), to turn ``next_ms`` into a local wake-up time."""
    read_within: float = 0.0
    """How far ``read_at`` may be off, in seconds: half the round trip."""
    capped: bool = False
    """``MAX_IN_FLIGHT`` held waiting messages back (``next_ms`` is then a look a second
    on): a slot an ack (or any verdict) frees lets one go, so fetch again once a verdict is
    in rather than wait until ``next_ms``."""


@dataclass(frozen=True, slots=True)
class Exhausted:
    """An exhausted message whose announcement was claimed (see ``claim_exhausted``)."""

    id: str
    queue: str
    payload: Any
    attempt: int
    claimed_until_ms: int
    """When the claim lapses (ms, Redis clock); ``confirm_exhausted`` presents it as the
    claim's token, so a confirm only ever removes the claim it made."""
    key: str | None = None
    """The key the message was sent with, or None."""
    reason: str = ""
    """Why it died: "" (its retries ran out, or it was rejected), "expired" (announced with
    ``message_expired``) or "postponed too often"."""
    group: str | None = None
    """The ordered group it was sent with, or None."""


def _payload_of(delivery: Delivery) -> Any:
    """The delivery's payload, decoded; ValueError if it cannot be handled."""
    if delivery.unreadable:
        raise ValueError(delivery.unreadable)
    return decode_payload(delivery.payload)


def _traced_delivery(delivery: Delivery) -> tuple[str, Delivery]:
    """The trace context a delivery's payload carries, and the delivery without it."""
    traceparent, text = split_trace(delivery.payload)
    return traceparent, dataclasses.replace(delivery, payload=text)


class QueueConsuming(QueueBase):
    """Fetching and the verdicts."""

    # Consuming

    @_reaching_redis
    def fetch(self, count: int | None = None, *, fetcher: str = "", request: str = "") -> Fetched:
        """Take up to ``count`` due messages (default FETCH_BATCH_SIZE), leased to the caller.

        A fetch's reply can be lost after Redis ran it (a cut connection, a timeout): to get
        those messages rather than leave them waiting for their deadline with an attempt
        used, name the fetcher and each request, and repeat the request that failed. A fetch
        with the same ``request`` as the fetcher's last one hands out again what that one
        took, and nothing new; use a new request id once a fetch returned.
        """
        result = self.store.fetch(
            self.config.fetch_batch_size if count is None else count,
            fetcher=fetcher,
            request=request,
        )
        messages: list[Message] = []
        undecodable = []
        for delivery in result.deliveries:
            traceparent = ""
            if delivery.payload[:1] == TRACE_MARK:
                traceparent, delivery = _traced_delivery(delivery)
            try:
                payload = _payload_of(delivery)
            except ValueError as error:
                logger.warning(
                    "undecodable payload, burying message id=%s queue=%s: %s",
                    loggable(delivery.id),
                    self.name,
                    error,
                )
                undecodable.append((delivery.id, delivery.lease, BURY))
                continue
            # Positional, in Message's field order: keywords cost the hot path more.
            messages.append(
                _message(
                    delivery.id,
                    self.name,
                    payload,
                    delivery.attempt,
                    delivery.budget,
                    delivery.lease,
                    delivery.deadline_ms,
                    delivery.due_ms,
                    traceparent,
                    delivery.key,
                    delivery.generation,
                    delivery.group,
                    delivery.tracked,
                )
            )
        self.store.nack(undecodable)
        return Fetched(
            messages,
            result.now_ms,
            result.next_ms,
            result.expired,
            result.exhaustions_owed,
            result.now_us,
            result.read_at,
            result.read_within,
            result.capped,
        )

    @_reaching_redis
    def ack(self, messages: Iterable[Message], *, fetcher: str = "", request: str = "") -> set[str]:
        """Messages handled: forget them. Returns the ids acked (a stale lease is skipped).

        An ack's reply can be lost after Redis ran it; repeated, it would find nothing left
        and return an empty set, as for an ack that came too late. To be told what it did
        instead, name the caller and each request, as for ``fetch``, and repeat a request
        that raised with the same id and the same messages: the repeat changes nothing and
        returns what the first run acked (within MAX_CONSUME_DURATION of it). Use a new
        request id for each new call, whatever its kind (ack, nack, bury).
        """
        handled = list(messages)
        leases = [(m.id, m.lease) for m in handled]
        # Deliveries say whether their message has a key: without any, the store skips the
        # key index (an ack of plain messages costs Redis what it did before keys).
        plain = all(m.key is None for m in handled)
        # Likewise whether the queue had expiries or postpone counts when they were fetched:
        # without any, the store skips those (see "Expiry and postpones" in _prelude.lua).
        untracked = not any(m.tracked for m in handled)
        return self.store.ack(
            leases, fetcher=fetcher, request=request, plain=plain, untracked=untracked
        )

    @_reaching_redis
    def nack(
        self,
        messages: Iterable[Message],
        *,
        delay: float | timedelta | None = None,
        fetcher: str = "",
        request: str = "",
        delays_ms: Mapping[str, int] | None = None,
        postponed: Collection[str] = (),
        attempts: Mapping[str, AttemptNote] | None = None,
    ) -> list[NackOutcome]:
        """Messages refused: retry each after NACK_REDELIVERY_DELAY (or ``delay``, or its
        own in ``delays_ms``, by id) while retries are left, else bury it in garbage. The
        ids in ``postponed`` are postponed instead (see ``postpone``). A retry due at or
        after the message's expiry buries it (its outcome's ``dead_reason`` is "expired").
        ``fetcher`` and ``request``: see ack.

        Each refusal leaves a record of its attempt (``history``): its note in
        ``attempts`` (by id; see ``attempt_note``), else one saying only the verdict
        ("nack", or "postpone") and this worker."""
        messages = list(messages)
        refusals = []
        for message in messages:
            if delays_ms is not None and message.id in delays_ms:
                delay_ms = delays_ms[message.id]
            elif delay is None:
                delay_ms = self.config.nack_delay_ms(message.attempt)
            else:
                delay_ms = delay_in_ms(delay)
            refusals.append((message.id, message.lease, delay_ms))
        return self.store.nack(
            refusals,
            fetcher=fetcher,
            request=request,
            postponed=postponed,
            max_postpones=self.config.max_postpones,
            attempts=self._notes(messages, attempts, NACK, postponed),
        )

    def attempt_note(
        self,
        message: Message,
        error: BaseException | None,
        *,
        verdict: str | None = None,
        ran_seconds: float | None = None,
    ) -> AttemptNote:
        """The attempt record a refusal of ``message`` writes: ``error`` as the queue's
        HISTORY_REDACT leaves it (None: the handler returned False), cut to its bounds;
        ``verdict`` by default the one the error stands for; ``ran_seconds`` how long the
        handler ran (the record's start is its verdict's time less that)."""
        return note_for(self.config, message, error, verdict=verdict, ran_seconds=ran_seconds)

    def _notes(
        self,
        messages: list[Message],
        attempts: Mapping[str, AttemptNote] | None,
        verdict: str,
        postponed: Collection[str] = (),
    ) -> dict[str, AttemptNote] | None:
        """Each refused message's note: its own in ``attempts``, else the verdict alone
        (none at all on a queue that keeps no records)."""
        if self.config.history_attempts == 0:
            return None
        given = attempts or {}
        return {
            message.id: given.get(message.id)
            or note_for(
                self.config, message, None, verdict=POSTPONE if message.id in postponed else verdict
            )
            for message in messages
        }

    @_reaching_redis
    def postpone(
        self,
        messages: Iterable[Message],
        *,
        delay: float | timedelta,
        fetcher: str = "",
        request: str = "",
        attempts: Mapping[str, AttemptNote] | None = None,
    ) -> list[NackOutcome]:
        """Messages not to handle yet: back after ``delay`` without using an attempt (what
        a handler's ``raise Postpone(delay)`` does). The postpone after MAX_POSTPONES of one
        message buries it (``dead_reason`` "postponed too often"); one due at or after its
        expiry too ("expired"). ``fetcher`` and ``request``: see ack; ``attempts``: see
        nack."""
        listed = list(messages)
        return self.nack(
            listed,
            delay=delay,
            fetcher=fetcher,
            request=request,
            postponed={message.id for message in listed},
            attempts=attempts,
        )

    @_reaching_redis
    def bury(
        self,
        messages: Iterable[Message],
        *,
        fetcher: str = "",
        request: str = "",
        attempts: Mapping[str, AttemptNote] | None = None,
    ) -> list[NackOutcome]:
        """Messages that must never be retried: straight to garbage, retries left or not.
        ``fetcher`` and ``request``: see ack; ``attempts``: see nack (the verdict alone is
        "reject")."""
        listed = list(messages)
        refusals = [(m.id, m.lease, BURY) for m in listed]
        notes = self._notes(listed, attempts, REJECT)
        return self.store.nack(refusals, fetcher=fetcher, request=request, attempts=notes)

    @_reaching_redis
    def release(self, messages: Sequence[Message]) -> list[str]:
        """Hand back messages fetched but never started; no retry is used."""
        return self.store.release([(m.id, m.lease) for m in messages])

    @_reaching_redis
    def extend(self, messages: Sequence[Message]) -> tuple[int, list[str]]:
        """Give messages still being handled a new deadline of now + MAX_CONSUME_DURATION."""
        return self.store.extend([(m.id, m.lease) for m in messages])

    @_reaching_redis
    def claim_exhausted(self, count: int = 100, *, claim_seconds: float = 60) -> list[Exhausted]:
        """Claim exhausted messages whose announcement is owed; confirm each afterwards."""
        claims = self.store.claim_exhausted(count, round(claim_seconds * 1000))
        exhausted = []
        for claim in claims:
            try:
                payload = (
                    None if claim.payload is None else decode_payload(split_trace(claim.payload)[1])
                )
            except ValueError:
                payload = None
            exhausted.append(
                Exhausted(
                    claim.id,
                    self.name,
                    payload,
                    claim.attempt,
                    claim.claimed_until_ms,
                    claim.key,
                    claim.reason,
                    claim.group,
                )
            )
        return exhausted

    @_reaching_redis
    def confirm_exhausted(self, claims: Iterable[Exhausted]) -> int:
        """Record that claimed exhaustions were announced; returns how many were confirmed.

        Takes the claims as ``claim_exhausted`` returned them: each is confirmed only while
        it still holds. One that lapsed and was claimed again by another worker, or whose
        message was requeued and exhausted anew meanwhile, stays for that newer claim.
        """
        pairs = []
        for claim in claims:
            if not isinstance(claim, Exhausted):
                raise TypeError(
                    f"confirm_exhausted takes the claims claim_exhausted returned, not {claim!r}"
                )
            pairs.append((claim.id, claim.claimed_until_ms))
        return self.store.confirm_exhausted(pairs)
