"""``Queue``: one configured queue, as producers, workers and the admin use it.

It validates and encodes what it is given, then leaves every change of state to the store's
Lua scripts. Bad input raises before anything is written.
"""

import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property, partial
from typing import Any, Concatenate, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import transaction
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.core import connections, features, stores, tracing
from delayqueue_django.core.conf import QueueConfig
from delayqueue_django.core.encoding import (
    decode_payload,
    delay_in_ms,
    due_spec,
    encode_payload,
    new_message_ids,
    retry_budget,
)
from delayqueue_django.core.message import Message
from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.engine import (
    BURY,
    STATES,
    Delivery,
    NackOutcome,
    NewMessage,
    Store,
    StoredMessage,
    loggable,
)
from delayqueue_django.engine.async_store import AsyncRedisStore
from delayqueue_django.engine.errors import QueueTimedOut, QueueUnavailable
from delayqueue_django.engine.invariants import InvariantReport, check_queue
from delayqueue_django.engine.records import TRACE_MARK, split_trace
from delayqueue_django.engine.sharded_store import ShardedStore
from delayqueue_django.engine.shards import SHARD_MARK, place
from delayqueue_django.exceptions import ConflictingOptions

logger = logging.getLogger("delayqueue_django")

# How many dead letters one purge or retention call deletes per script call.
GARBAGE_DROP_BATCH = 1000
# Per-minute throughput counts older than this are pruned by the workers.
THROUGHPUT_MINUTES_KEPT = 60


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


def _payload_of(delivery: Delivery) -> Any:
    """The delivery's payload, decoded; ValueError if it cannot be handled."""
    if delivery.unreadable:
        raise ValueError(delivery.unreadable)
    return decode_payload(delivery.payload)


def _traced_delivery(delivery: Delivery) -> tuple[str, Delivery]:
    """The trace context a delivery's payload carries, and the delivery without it."""
    traceparent, text = split_trace(delivery.payload)
    return traceparent, dataclasses.replace(delivery, payload=text)


P = ParamSpec("P")
R = TypeVar("R")


def _reaching_redis(
    method: "Callable[Concatenate[Queue, P], R]",
) -> "Callable[Concatenate[Queue, P], R]":
    """A Queue method whose Redis cannot be reached raises QueueUnavailable, which says
    where, instead of redis-py's error (its ``__cause__``)."""

    @functools.wraps(method)
    def call(queue: "Queue", /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(queue, *args, **kwargs)
        except QueueUnavailable:
            raise
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise queue.unavailable(error) from error

    return call


def _areaching_redis(
    method: "Callable[Concatenate[Queue, P], Coroutine[Any, Any, R]]",
) -> "Callable[Concatenate[Queue, P], Coroutine[Any, Any, R]]":
    """``_reaching_redis`` for the async methods."""

    @functools.wraps(method)
    async def call(queue: "Queue", /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(queue, *args, **kwargs)
        except QueueUnavailable:
            raise
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise queue.unavailable(error) from error

    return call


def _check_id(message_id: Any) -> str:
    if not isinstance(message_id, str) or not message_id:
        raise TypeError(f"message id must be a non-empty str, not {message_id!r}")
    return message_id


class Queue:
    """One queue of ``DELAYQUEUES``; get it with ``delayqueue_django.get_queue(name)``."""

    def __init__(self, config: QueueConfig, store: Store | None = None) -> None:
        self.config = config
        self.name = config.name
        # Redis, or the in-process memory store (see delayqueue_django.core.stores); built from
        # the settings on first use when not given (see store).
        self._store = store
        self._store_lock = threading.Lock()
        self._async_stores: weakref.WeakKeyDictionary[Any, AsyncRedisStore] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    @property
    def store(self) -> Store:
        """The queue's store, built on first use: a Redis Cluster client asks the cluster
        for its slots as it is built, which an outbox send, written to the database alone,
        must never wait for (nor fail on) while a master hangs."""
        store = self._store
        if store is None:
            with self._store_lock:
                if self._store is None:
                    self._store = self._build_store()
                store = self._store
        return store

    def _build_store(self) -> Store:
        """The store of the settings. A Redis Cluster client reads the cluster's slots as
        it is built: a cluster that cannot be reached raises QueueUnavailable, which names
        the queue, not redis-py's RedisClusterException."""
        try:
            return stores.store_for(self.config)
        except (RedisClusterException, RedisConnectionError, RedisTimeoutError) as error:
            # Where from the settings alone: ``address`` would read the store being built.
            where = connections.address(self.config)
            raise QueueUnavailable(
                f"queue {self.name!r} cannot reach Redis at {where}: {error}"
            ) from error

    @cached_property
    def address(self) -> str:
        """Where the queue's Redis is (host:port, …), for messages: never credentials."""
        return connections.address(self.config, getattr(self.store, "client", None))

    def unavailable(self, error: Exception) -> QueueUnavailable:
        """The package's error for redis-py's ConnectionError or TimeoutError on this queue."""
        if isinstance(error, RedisTimeoutError):
            return QueueTimedOut(
                f"queue {self.name!r}: Redis at {self.address} did not answer in time, so the "
                f"call may or may not have run: {error}"
            )
        return QueueUnavailable(
            f"queue {self.name!r} cannot reach Redis at {self.address}: {error}"
        )

    @property
    def schedules(self) -> Any:
        """The queue's recurring messages: list, add, change, pause, resume, remove (a
        ``delayqueue_django.schedules.api.Schedules``, which the schedules wing plugs in)."""
        return features.schedules_of(self)

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
        outbox: bool | None = None,
    ) -> str:
        """Schedule one message; returns its id. One round trip.

        ``on_commit`` (default: the queue's SEND_ON_COMMIT) writes it to Redis only when the
        current transaction on database ``using`` commits, and never if it rolls back; the id
        is returned at once all the same. ``outbox`` (default: the queue's OUTBOX) writes it
        instead as a row of that database's outbox table, in the transaction, for a relay to
        move to Redis once it committed (see delayqueue_django.outbox.table).
        """
        return self._send_all(
            [payload],
            batch=False,
            delay=delay,
            at=at,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
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
        outbox: bool | None = None,
    ) -> list[str]:
        """Schedule many messages in one round trip; returns their ids in order.

        Items are payloads sharing the timing given here, or ``Outgoing`` objects carrying
        their own. Every item is validated before anything is written (or deferred); with
        ``outbox``, they are written as outbox rows, in INSERTs of at most 4 MiB each (see
        outbox.INSERT_BYTES) in the current transaction, or one of their own: all or none.
        """
        return self._send_all(
            messages,
            batch=True,
            delay=delay,
            at=at,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
        )

    def _send_all(
        self,
        messages: Iterable[Any],
        *,
        batch: bool,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
        on_commit: bool | None,
        using: str | None,
        outbox: bool | None,
    ) -> list[str]:
        """send_many's work; ``batch`` says whether the caller was a batch API (the tracing
        conventions name a batch's message count, and a single message's id)."""
        through_outbox = self._outbox(outbox, on_commit)
        prepared = self._prepare_all(messages, delay=delay, at=at, retry_count=retry_count)
        if not prepared:
            return []
        if tracing.active():
            with tracing.producer_span(self.name, prepared, batch=batch) as stamped:
                self._dispatch(stamped, through_outbox, on_commit, using)
        else:
            self._dispatch(prepared, through_outbox, on_commit, using)
        return [message.id for message in prepared]

    def _dispatch(
        self,
        prepared: list[NewMessage],
        through_outbox: bool,
        on_commit: bool | None,
        using: str | None,
    ) -> None:
        if through_outbox:
            features.outbox().write(self.name, prepared, using=using)
        elif self._on_commit(on_commit):
            # A delay still counts from when Redis receives the message, at the commit.
            transaction.on_commit(partial(self._write, prepared), using=using)
        else:
            self._write(prepared)

    @_reaching_redis
    def _write(self, prepared: list[NewMessage]) -> None:
        self.store.send(prepared)

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
        outbox: bool | None = None,
    ) -> str:
        """``send`` for async code."""
        ids = await self._asend_all(
            [payload],
            batch=False,
            delay=delay,
            at=at,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
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
        outbox: bool | None = None,
    ) -> list[str]:
        """``send_many`` for async code."""
        return await self._asend_all(
            messages,
            batch=True,
            delay=delay,
            at=at,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
        )

    @_areaching_redis
    async def _asend_all(
        self,
        messages: Iterable[Any],
        *,
        batch: bool,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
        on_commit: bool | None,
        using: str | None,
        outbox: bool | None,
    ) -> list[str]:
        through_outbox = self._outbox(outbox, on_commit)
        if through_outbox or self._on_commit(on_commit):
            # Transactions belong to the sync world: join its thread, where the
            # transaction is, and write (or defer) there.
            send_all = sync_to_async(self._send_all, thread_sensitive=True)
            return await send_all(
                list(messages),
                batch=batch,
                delay=delay,
                at=at,
                retry_count=retry_count,
                on_commit=not through_outbox,
                using=using,
                outbox=through_outbox,
            )
        prepared = self._prepare_all(messages, delay=delay, at=at, retry_count=retry_count)
        if not prepared:
            return []
        if tracing.active():
            with tracing.producer_span(self.name, prepared, batch=batch) as stamped:
                await self._awrite(stamped)
        else:
            await self._awrite(prepared)
        return [message.id for message in prepared]

    async def _awrite(self, prepared: list[NewMessage]) -> None:
        store = self.async_store()
        if store is None:
            await sync_to_async(self._write, thread_sensitive=False)(prepared)
        else:
            await store.send(prepared)

    @_areaching_redis
    async def acancel(self, message_id: str) -> bool:
        """``cancel`` for async code."""
        _check_id(message_id)
        store = self.async_store()
        if store is None or SHARD_MARK in message_id:
            # (An id of another shard: the sync store finds it.)
            return await sync_to_async(self.cancel, thread_sensitive=False)(message_id)
        return await store.remove(message_id) is not None

    @_areaching_redis
    async def astats(self) -> dict[str, int]:
        """``stats`` for async code."""
        store = self.async_store()
        if store is None or self.config.outbox or self._drains():
            # The outbox is read through the ORM, which belongs to the sync world.
            return await sync_to_async(self.stats, thread_sensitive=True)()
        # (Shard 0 alone, which either answers or raises.)
        return {**await store.stats(), "shards_down": 0}

    def _drains(self) -> bool:
        """Whether the store may read shards other than shard 0: it drains an earlier
        layout, or has not read the register of layouts lately (a sync call does)."""
        store = self.store
        return isinstance(store, ShardedStore) and store.draining() != ()

    def async_store(self) -> AsyncRedisStore | None:
        """The redis.asyncio store of shard 0 for the running event loop, or None for a
        django-redis alias or a memory queue (no asyncio client there), or a sharded
        queue."""
        client = connections.async_client_for(self.config)
        if client is None or self.config.shards > 1:
            # (A sharded queue's sends go shard by shard: through its sync store.)
            return None
        store = self._async_stores.get(client)
        if store is None:
            store = AsyncRedisStore(client, self.store.keys, self.store.limits)
            self._async_stores[client] = store
        return store

    def _on_commit(self, on_commit: bool | None) -> bool:
        return self.config.send_on_commit if on_commit is None else on_commit

    def _outbox(self, outbox: bool | None, on_commit: bool | None) -> bool:
        """Whether a send goes through the outbox: ``outbox``, else (unless the call asks
        for ``on_commit``) the queue's OUTBOX. Asking for both is refused."""
        if outbox and on_commit:
            raise ConflictingOptions(
                "send(outbox=True, on_commit=True): choose one. The outbox writes the message "
                "in the transaction and a relay sends it after the commit, so it already "
                "waits for the commit, and survives Redis being away then."
            )
        if outbox is not None:
            return outbox
        return self.config.outbox and not on_commit

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
        # Each id's shard is chosen from the settings' layout, as the store would: an outbox
        # send touches no Redis, nor builds its client.
        ids = place(new_message_ids(len(items)), self.config.shards)
        for message_id, item in zip(ids, items, strict=True):
            if isinstance(item, Outgoing):
                at_ms, delay_us, budget = self._timing(item.delay, item.at, item.retry_count)
                payload = item.payload
            else:
                if shared is None:
                    shared = self._timing(delay, at, retry_count)
                at_ms, delay_us, budget = shared
                payload = item
            text = encode_payload(payload, max_bytes=max_bytes, queue=name)
            prepared.append(NewMessage(message_id, text, budget, at_ms, delay_us))
        return prepared

    def _timing(
        self, delay: float | timedelta | None, at: datetime | None, retry_count: int | None
    ) -> tuple[int | None, int, int]:
        at_ms, delay_us = due_spec(delay, at)
        return at_ms, delay_us, retry_budget(retry_count, self.config.retry_count)

    @_reaching_redis
    def cancel(self, message_id: str) -> bool:
        """True if the message was waiting and now will never be delivered.

        False if the queue does not know it, or it is in flight, already handled or dead.
        """
        return self.store.remove(_check_id(message_id)) is not None

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
                    traceparent=traceparent,
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
        return self.store.ack([(m.id, m.lease) for m in messages], fetcher=fetcher, request=request)

    @_reaching_redis
    def nack(
        self,
        messages: Iterable[Message],
        *,
        delay: float | timedelta | None = None,
        fetcher: str = "",
        request: str = "",
    ) -> list[NackOutcome]:
        """Messages refused: retry each after NACK_REDELIVERY_DELAY (or ``delay``) while
        retries are left, else bury it in garbage. ``fetcher`` and ``request``: see ack."""
        refusals = []
        for message in messages:
            if delay is None:
                delay_ms = self.config.nack_delay_ms(message.attempt)
            else:
                delay_ms = delay_in_ms(delay)
            refusals.append((message.id, message.lease, delay_ms))
        return self.store.nack(refusals, fetcher=fetcher, request=request)

    @_reaching_redis
    def bury(
        self, messages: Iterable[Message], *, fetcher: str = "", request: str = ""
    ) -> list[NackOutcome]:
        """Messages that must never be retried: straight to garbage, retries left or not.
        ``fetcher`` and ``request``: see ack."""
        refusals = [(m.id, m.lease, BURY) for m in messages]
        return self.store.nack(refusals, fetcher=fetcher, request=request)

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
                Exhausted(claim.id, self.name, payload, claim.attempt, claim.claimed_until_ms)
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

    # Inspecting and operating

    @_reaching_redis
    def stats(self) -> dict[str, int]:
        """Counts per state and timing, in one round trip (one per shard of a sharded
        queue).

        Keys: pending, ready, unack, retry, garbage, due (pending and already due),
        unannounced (exhaustions not yet signalled), server_time_ms, next_due_ms (-1 when
        nothing is pending), lag_ms (age of the oldest due pending message), and the
        running totals since the queue began: acked_total, failed_total, retried_total,
        timed_out_total, exhausted_total. A queue whose ``OUTBOX`` option is on also has
        ``outbox`` and ``outbox_age_ms`` (see ``outbox_stats``), read from its database: its
        senders write there, so whoever reads its stats can too.

        ``shards_down`` (always there, 0 normally) counts the shards of a sharded queue
        whose Redis could not be read: the other figures then leave them out (the counts
        and totals are short, the times those of the shards read). A shard on a server
        that already failed this call is not asked. Raises QueueUnavailable only when no
        shard at all could be read.
        """
        counts = self.store.stats()
        if self.config.outbox:
            counts.update(self.outbox_stats())
        return counts

    @_reaching_redis
    def outbox_stats(self) -> dict[str, int]:
        """This queue's rows waiting in the outbox (DELAYQUEUE_OUTBOX_DATABASES), read from
        the database: ``outbox`` (how many) and ``outbox_age_ms`` (how long the oldest has
        waited; 0 when none). ``stats()`` includes them for a queue whose OUTBOX option is on."""
        return features.outbox().waiting(self.name)

    def check_invariants(self) -> InvariantReport:
        """Check the queue's state in Redis: every message in exactly one state, nothing
        orphaned (see ``engine.invariants``). One atomic read of the whole queue: O(n)."""
        return check_queue(self.store)

    @_reaching_redis
    def throughput(self, minutes: int = 15) -> list[tuple[int, int, int]]:
        """Acked and failed deliveries per minute: ``(minute_start_ms, acked, failed)`` for
        the last ``minutes`` minutes (Redis clock), oldest first, in one round trip."""
        if not 1 <= minutes <= THROUGHPUT_MINUTES_KEPT:
            raise ValueError(f"minutes must be 1..{THROUGHPUT_MINUTES_KEPT}, not {minutes}")
        return self.store.throughput(minutes)

    @_reaching_redis
    def prune_throughput(self) -> int:
        return self.store.prune_throughput(THROUGHPUT_MINUTES_KEPT)

    @_reaching_redis
    def list_messages(
        self, state: str, *, offset: int = 0, limit: int = 50, preview_bytes: int = 1000
    ) -> list[StoredMessage]:
        """One page of messages in a state (pending, ready, unack, retry or garbage)."""
        if offset < 0 or not 0 <= limit <= 1000:
            raise ValueError(f"offset must be >= 0 and limit 0..1000 (got {offset}, {limit})")
        return self.store.list(state, offset=offset, limit=limit, preview_bytes=preview_bytes)

    @_reaching_redis
    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        """Where a message is and what it holds, or None if the queue does not know it.

        The payload comes whole by default. With ``preview_bytes``, a longer one is cut in
        Redis to at most that many bytes, on a UTF-8 character boundary, as
        [`list_messages`][delayqueue_django.core.queue.Queue.list_messages] cuts its previews: the
        rest never leaves Redis. ``payload_size`` is the whole payload's size either way, so
        ``payload_size > preview_bytes`` says it was cut.
        """
        if preview_bytes is not None and preview_bytes < 0:
            raise ValueError(f"preview_bytes must be >= 0 or None (got {preview_bytes})")
        return self.store.peek(_check_id(message_id), preview_bytes=preview_bytes)

    @_reaching_redis
    def peek_payload(self, message_id: str) -> bytes | None:
        """A message's whole payload as the very bytes stored, or None if it has none (the
        admin's download). ``peek`` gives it as text, where bytes that are not UTF-8 (only a
        write from outside the app stores them) are shown as ``\\xNN`` escapes; here they
        stay those bytes."""
        return self.store.peek_payload(_check_id(message_id))

    @_reaching_redis
    def delete(self, message_id: str, *, state: str | None = None) -> str | None:
        """Delete a message from whatever state it is in, or only if it is in ``state``
        (one of pending, ready, unack, retry, garbage: the state an operator saw it in);
        returns the state it left, or None."""
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
        return self.store.remove(
            _check_id(message_id), include_in_flight_and_dead=True, only_from=state
        )

    @_reaching_redis
    def requeue(self, message_ids: Sequence[str]) -> list[str]:
        """Dead letters back to pending, due now, with a fresh retry budget."""
        return self.store.requeue([_check_id(i) for i in message_ids], self.config.retry_count)

    @_reaching_redis
    def held(self, message_ids: Sequence[str]) -> set[str]:
        """Those of these messages the queue still holds, in any state (dead letters too)."""
        return self.store.held([_check_id(i) for i in message_ids])

    @_reaching_redis
    def deliver_now(self, message_ids: Sequence[str]) -> list[str]:
        """Pending messages made due now."""
        return self.store.promote([_check_id(i) for i in message_ids])

    def purge_garbage(self, *, buried_before_ms: int | None = None) -> int:
        """Delete every dead letter, or only those buried before ``buried_before_ms`` (on
        Redis's clock, as ``stats()["server_time_ms"]``: those an operator was shown);
        returns how many."""
        return self._drop_garbage(
            older_than_ms=None, keep_unannounced=False, buried_before_ms=buried_before_ms
        )

    def expire_garbage(self) -> int:
        """Delete dead letters older than GARBAGE_RETENTION whose exhaustion was announced."""
        retention = self.config.garbage_retention_ms
        if retention is None:
            return 0
        return self._drop_garbage(older_than_ms=retention, keep_unannounced=True)

    @_reaching_redis
    def _drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        keep_unannounced: bool,
        buried_before_ms: int | None = None,
    ) -> int:
        """In calls of GARBAGE_DROP_BATCH, each bounded; the dead letters one keeps (still
        unannounced) are passed over by the next, so they never hide those behind them."""
        total, kept = 0, 0
        while True:
            dropped, kept_now = self.store.drop_garbage(
                older_than_ms=older_than_ms,
                limit=GARBAGE_DROP_BATCH,
                keep_unannounced=keep_unannounced,
                offset=kept,
                buried_before_ms=buried_before_ms,
            )
            total += dropped
            kept += kept_now
            if dropped + kept_now < GARBAGE_DROP_BATCH:
                return total
