"""``Queue``: one configured queue, as producers, workers and the admin use it.

It validates and encodes what it is given, then leaves every change of state to the store's
Lua scripts. Bad input raises before anything is written.
"""

import logging
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from delayqueue_django import connections
from delayqueue_django.conf import QueueConfig
from delayqueue_django.encoding import (
    decode_payload,
    due_spec,
    encode_payload,
    new_message_ids,
    retry_budget,
)
from delayqueue_django.engine import BURY, NackOutcome, NewMessage, Store, StoredMessage
from delayqueue_django.engine.async_store import AsyncRedisStore
from delayqueue_django.engine.invariants import InvariantReport, check_queue
from delayqueue_django.message import Message
from delayqueue_django.outgoing import Outgoing

logger = logging.getLogger("delayqueue_django")

# How many dead letters one purge or retention call deletes per script call.
GARBAGE_DROP_BATCH = 1000
# Per-minute throughput counts older than this are pruned by the workers.
THROUGHPUT_MINUTES_KEPT = 60


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one fetch brought: messages, and when the queue next has work."""

    messages: list[Message]
    now_ms: int  # the Redis clock when the fetch ran (now_us: the microseconds past it)
    # now_ms if more work is waiting; the next due time or deadline; None if nothing is.
    next_ms: int | None
    expired: int
    # An exhausted message's announcement is owed: claim_exhausted has work.
    exhaustions_owed: bool
    now_us: int = 0
    read_at: float = 0.0  # time.monotonic() when the clock was read (see FetchResult)


@dataclass(frozen=True, slots=True)
class Exhausted:
    """An exhausted message whose announcement was claimed (see ``claim_exhausted``)."""

    id: str
    queue: str
    payload: Any
    attempt: int


def _check_id(message_id: Any) -> str:
    if not isinstance(message_id, str) or not message_id:
        raise TypeError(f"message id must be a non-empty str, not {message_id!r}")
    return message_id


class Queue:
    def __init__(self, config: QueueConfig, store: Store) -> None:
        self.config = config
        self.name = config.name
        # Redis, or the in-process memory store (see delayqueue_django.stores).
        self.store = store
        self._async_stores: weakref.WeakKeyDictionary[Any, AsyncRedisStore] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    # Producing

    def send(
        self,
        payload: Any,
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
    ) -> str:
        """Schedule one message; returns its id. One round trip.

        ``on_commit`` (default: the queue's SEND_ON_COMMIT) writes it to Redis only when the
        current transaction on database ``using`` commits, and never if it rolls back; the id
        is returned at once all the same.
        """
        return self.send_many(
            [payload], delay=delay, at=at, retry_count=retry_count, on_commit=on_commit, using=using
        )[0]

    def send_many(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
    ) -> list[str]:
        """Schedule many messages in one round trip; returns their ids in order.

        Items are payloads sharing the timing given here, or ``Outgoing`` objects carrying
        their own. Every item is validated before anything is written (or deferred).
        """
        prepared = self._prepare_all(messages, delay=delay, at=at, retry_count=retry_count)
        if not prepared:
            return []
        if self._on_commit(on_commit):
            # A delay still counts from when Redis receives the message, at the commit.
            transaction.on_commit(partial(self.store.send, prepared), using=using)
        else:
            self.store.send(prepared)
        return [message.id for message in prepared]

    # Async producing: redis.asyncio for URL queues; a django-redis alias has no asyncio
    # client (nor has a memory queue), so its calls run the sync client in a worker thread.

    async def asend(
        self,
        payload: Any,
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
    ) -> str:
        """``send`` for async code."""
        ids = await self.asend_many(
            [payload], delay=delay, at=at, retry_count=retry_count, on_commit=on_commit, using=using
        )
        return ids[0]

    async def asend_many(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
    ) -> list[str]:
        """``send_many`` for async code."""
        if self._on_commit(on_commit):
            # Transactions belong to the sync world: join its thread, where the
            # transaction is, and defer there.
            send_many = sync_to_async(self.send_many, thread_sensitive=True)
            return await send_many(
                list(messages),
                delay=delay,
                at=at,
                retry_count=retry_count,
                on_commit=True,
                using=using,
            )
        prepared = self._prepare_all(messages, delay=delay, at=at, retry_count=retry_count)
        if prepared:
            store = self.async_store()
            if store is None:
                await sync_to_async(self.store.send, thread_sensitive=False)(prepared)
            else:
                await store.send(prepared)
        return [message.id for message in prepared]

    async def acancel(self, message_id: str) -> bool:
        """``cancel`` for async code."""
        _check_id(message_id)
        store = self.async_store()
        if store is None:
            return await sync_to_async(self.cancel, thread_sensitive=False)(message_id)
        return await store.remove(message_id) is not None

    async def astats(self) -> dict[str, int]:
        """``stats`` for async code."""
        store = self.async_store()
        if store is None:
            return await sync_to_async(self.stats, thread_sensitive=False)()
        return await store.stats()

    def async_store(self) -> AsyncRedisStore | None:
        """The redis.asyncio store for the running event loop, or None for a django-redis
        alias or a memory queue (no asyncio client there)."""
        client = connections.async_client_for(self.config)
        if client is None:
            return None
        store = self._async_stores.get(client)
        if store is None:
            store = AsyncRedisStore(client, self.store.keys, self.store.limits)
            self._async_stores[client] = store
        return store

    def _on_commit(self, on_commit: bool | None) -> bool:
        return self.config.send_on_commit if on_commit is None else on_commit

    def _prepare_all(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
    ) -> list[NewMessage]:
        """Validate and encode every message (payloads, or Outgoing with their own timing)."""
        items = list(messages)
        if not items:
            return []
        max_bytes, name = self.config.max_payload_bytes, self.name
        shared: tuple[int | None, int, int] | None = None  # the call's own timing, checked once
        prepared = []
        for message_id, item in zip(new_message_ids(len(items)), items, strict=True):
            if isinstance(item, Outgoing):
                at_ms, delay_ms, budget = self._timing(item.delay, item.at, item.retry_count)
                payload = item.payload
            else:
                if shared is None:
                    shared = self._timing(delay, at, retry_count)
                at_ms, delay_ms, budget = shared
                payload = item
            text = encode_payload(payload, max_bytes=max_bytes, queue=name)
            prepared.append(NewMessage(message_id, text, budget, at_ms, delay_ms))
        return prepared

    def _timing(
        self, delay: float | timedelta | None, at: datetime | None, retry_count: int | None
    ) -> tuple[int | None, int, int]:
        at_ms, delay_ms = due_spec(delay, at)
        return at_ms, delay_ms, retry_budget(retry_count, self.config.retry_count)

    def cancel(self, message_id: str) -> bool:
        """True if the message was waiting and now will never be delivered.

        False if the queue does not know it, or it is in flight, already handled or dead.
        """
        return self.store.remove(_check_id(message_id)) is not None

    # Consuming

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
            try:
                payload = decode_payload(delivery.payload)
            except ValueError as error:
                logger.warning(
                    "undecodable payload, burying message id=%s queue=%s: %s",
                    delivery.id,
                    self.name,
                    error,
                )
                undecodable.append((delivery.id, delivery.lease, BURY))
                continue
            messages.append(
                Message(
                    id=delivery.id,
                    queue=self.name,
                    payload=payload,
                    attempt=delivery.attempt,
                    retry_count=delivery.budget,
                    lease=delivery.lease,
                    deadline_ms=delivery.deadline_ms,
                    due_ms=delivery.due_ms,
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
        )

    def ack(self, messages: Iterable[Message]) -> set[str]:
        """Messages handled: forget them. Returns the ids acked (a stale lease is skipped)."""
        return self.store.ack([(m.id, m.lease) for m in messages])

    def nack(
        self, messages: Iterable[Message], *, delay: float | timedelta | None = None
    ) -> list[NackOutcome]:
        """Messages refused: retry each after NACK_REDELIVERY_DELAY (or ``delay``) while
        retries are left, else bury it in garbage."""
        refusals = []
        for message in messages:
            if delay is None:
                delay_ms = self.config.nack_delay_ms(message.attempt)
            else:
                delay_ms = due_spec(delay, None)[1]
            refusals.append((message.id, message.lease, delay_ms))
        return self.store.nack(refusals)

    def bury(self, messages: Iterable[Message]) -> list[NackOutcome]:
        """Messages that must never be retried: straight to garbage, retries left or not."""
        return self.store.nack([(m.id, m.lease, BURY) for m in messages])

    def release(self, messages: Sequence[Message]) -> list[str]:
        """Hand back messages fetched but never started; no retry is used."""
        return self.store.release([(m.id, m.lease) for m in messages])

    def extend(self, messages: Sequence[Message]) -> tuple[int, list[str]]:
        """Give messages still being handled a new deadline of now + MAX_CONSUME_DURATION."""
        return self.store.extend([(m.id, m.lease) for m in messages])

    def claim_exhausted(self, count: int = 100, *, claim_seconds: float = 60) -> list[Exhausted]:
        """Claim exhausted messages whose announcement is owed; confirm each afterwards."""
        claims = self.store.claim_exhausted(count, round(claim_seconds * 1000))
        exhausted = []
        for claim in claims:
            try:
                payload = None if claim.payload is None else decode_payload(claim.payload)
            except ValueError:
                payload = None
            exhausted.append(Exhausted(claim.id, self.name, payload, claim.attempt))
        return exhausted

    def confirm_exhausted(self, message_ids: Sequence[str]) -> int:
        return self.store.confirm_exhausted(message_ids)

    # Inspecting and operating

    def stats(self) -> dict[str, int]:
        """Counts per state and timing, in one round trip.

        Keys: pending, ready, unack, retry, garbage, due (pending and already due),
        unannounced (exhaustions not yet signalled), server_time_ms, next_due_ms (-1 when
        nothing is pending), lag_ms (age of the oldest due pending message).
        """
        return self.store.stats()

    def check_invariants(self) -> InvariantReport:
        """Check the queue's state in Redis: every message in exactly one state, nothing
        orphaned (see ``engine.invariants``). One atomic read of the whole queue: O(n)."""
        return check_queue(self.store)

    def throughput(self, minutes: int = 15) -> list[tuple[int, int, int]]:
        """Acked and failed deliveries per minute: ``(minute_start_ms, acked, failed)`` for
        the last ``minutes`` minutes (Redis clock), oldest first, in one round trip."""
        if not 1 <= minutes <= THROUGHPUT_MINUTES_KEPT:
            raise ValueError(f"minutes must be 1..{THROUGHPUT_MINUTES_KEPT}, not {minutes}")
        return self.store.throughput(minutes)

    def prune_throughput(self) -> int:
        return self.store.prune_throughput(THROUGHPUT_MINUTES_KEPT)

    def list_messages(
        self, state: str, *, offset: int = 0, limit: int = 50, preview_bytes: int = 1000
    ) -> list[StoredMessage]:
        """One page of messages in a state (pending, ready, unack, retry or garbage)."""
        if offset < 0 or not 0 <= limit <= 1000:
            raise ValueError(f"offset must be >= 0 and limit 0..1000 (got {offset}, {limit})")
        return self.store.list(state, offset=offset, limit=limit, preview_bytes=preview_bytes)

    def peek(self, message_id: str) -> StoredMessage | None:
        return self.store.peek(_check_id(message_id))

    def delete(self, message_id: str) -> str | None:
        """Delete a message from whatever state it is in; returns that state or None."""
        return self.store.remove(_check_id(message_id), include_in_flight_and_dead=True)

    def requeue(self, message_ids: Sequence[str]) -> list[str]:
        """Dead letters back to pending, due now, with a fresh retry budget."""
        return self.store.requeue([_check_id(i) for i in message_ids], self.config.retry_count)

    def deliver_now(self, message_ids: Sequence[str]) -> list[str]:
        """Pending messages made due now."""
        return self.store.promote([_check_id(i) for i in message_ids])

    def purge_garbage(self) -> int:
        """Delete every dead letter; returns how many."""
        return self._drop_garbage(older_than_ms=None, keep_unannounced=False)

    def expire_garbage(self) -> int:
        """Delete dead letters older than GARBAGE_RETENTION whose exhaustion was announced."""
        retention = self.config.garbage_retention_ms
        if retention is None:
            return 0
        return self._drop_garbage(older_than_ms=retention, keep_unannounced=True)

    def _drop_garbage(self, *, older_than_ms: int | None, keep_unannounced: bool) -> int:
        total, more = 0, True
        while more:
            dropped, more = self.store.drop_garbage(
                older_than_ms=older_than_ms,
                limit=GARBAGE_DROP_BATCH,
                keep_unannounced=keep_unannounced,
            )
            total += dropped
        return total
