"""``Queue``'s async twins of its producer and inspection calls."""

from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Never

from asgiref.sync import sync_to_async

from delayqueue_django.core import connections, tracing
from delayqueue_django.core.encoding import due_spec
from delayqueue_django.core.outgoing import refuse_call_options
from delayqueue_django.core.queue.base import _areaching_redis, _check_address
from delayqueue_django.core.queue.group_options import check_group
from delayqueue_django.core.queue.key_options import KEEP, UNKEYED, key_fields
from delayqueue_django.core.queue.operating import QueueOperating
from delayqueue_django.core.queue.producing import (
    QueueProducing,
    _named_ids,
    refusals_worded_for,
    timing_only,
)
from delayqueue_django.engine import NewMessage, StoredMessage
from delayqueue_django.engine.async_store import AsyncRedisStore
from delayqueue_django.engine.records import Attempts
from delayqueue_django.engine.sharding.placement import SHARD_MARK
from delayqueue_django.engine.sharding.store import ShardedStore


class QueueAsync(QueueProducing, QueueOperating):
    """asend, asend_many, acancel, areschedule, alookup, amessage, ahistory and astats."""

    # Async producing: redis.asyncio for URL queues; a django-redis alias has no asyncio
    # client (nor has a memory queue), so its calls run the sync client in a worker thread.

    async def asend(
        self,
        payload: Any,
        *,
        key: str | None = None,
        if_exists: str = KEEP,
        unique_for: float | timedelta | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
        outbox: bool | None = None,
        group: str | None = None,
    ) -> str:
        """``send`` for async code."""
        if timing_only(key, group, expires, on_commit, outbox, unique_for, if_exists):
            plain = self._plain_message(payload, delay, at, retry_count)
            if plain is not None:
                return await self._awrite_plain(plain)
        ids = await self._asend_all(
            [payload],
            batch=False,
            delay=delay,
            at=at,
            expires=expires,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
            keyed=key_fields(key, if_exists, unique_for),
            group=check_group(group),
        )
        return ids[0]

    async def asend_many(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
        outbox: bool | None = None,
        **per_message: Never,
    ) -> list[str]:
        """``send_many`` for async code."""
        refuse_call_options("asend_many", per_message)
        return await self._asend_all(
            messages,
            batch=True,
            delay=delay,
            at=at,
            expires=expires,
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
        keyed: tuple[str | None, str, int] = UNKEYED,
        group: str | None = None,
        expires: float | timedelta | datetime | None = None,
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
                keyed=keyed,
                group=group,
                expires=expires,
            )
        prepared = self._prepare_all(
            messages,
            delay=delay,
            at=at,
            retry_count=retry_count,
            keyed=keyed,
            group=group,
            expires=expires,
        )
        if not prepared:
            return []
        if tracing.active():
            with tracing.producer_span(self.name, prepared, batch=batch) as stamped:
                return await self._awrite(stamped, batch)
        return await self._awrite(prepared, batch)

    @_areaching_redis
    async def _awrite_plain(self, message: NewMessage) -> str:
        """_write_plain on redis.asyncio (see QueueProducing._plain_message)."""
        store = self.async_store()
        if store is None:
            return await sync_to_async(self._write_plain, thread_sensitive=False)(message)
        with refusals_worded_for(batch=False):
            await store.send((message,))
        return message.id

    async def _awrite(self, prepared: list[NewMessage], batch: bool) -> list[str]:
        """``_write`` on redis.asyncio (the keyed messages first, likewise)."""
        store = self.async_store()
        keyed = [message for message in prepared if message.key is not None]
        if store is None or (keyed and self._drains()):
            # (A key's message may wait on an earlier layout's shard: the sync store finds
            # it, see engine.sharding.store.)
            write = partial(self._write, batch=batch)
            return await sync_to_async(write, thread_sensitive=False)(prepared)
        with refusals_worded_for(batch):
            return await self._awrite_keyed_first(store, prepared, keyed)

    async def _awrite_keyed_first(
        self, store: AsyncRedisStore, prepared: list[NewMessage], keyed: list[NewMessage]
    ) -> list[str]:
        if not keyed:
            await store.send(prepared)
            return [message.id for message in prepared]
        sent = await store.send_keyed(keyed)
        plain = [message for message in prepared if message.key is None]
        if plain:
            await store.send(plain)
        return _named_ids(prepared, sent)

    @_areaching_redis
    async def acancel(self, message_id: str | None = None, *, key: str | None = None) -> bool:
        """``cancel`` for async code."""
        address, by_key = _check_address("cancel", message_id, key)
        store = self.async_store()
        if store is None or (SHARD_MARK in address if not by_key else self._drains()):
            # (An id of another shard, or a key that may be on one: the sync store finds it.)
            return await sync_to_async(self.cancel, thread_sensitive=False)(message_id, key=key)
        if by_key:
            return await store.cancel_key(address) is not None
        return await store.remove(address) is not None

    @_areaching_redis
    async def areschedule(
        self,
        message_id: str | None = None,
        *,
        key: str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> bool:
        """``reschedule`` for async code."""
        address, by_key = _check_address("reschedule", message_id, key)
        store = self.async_store()
        if store is None or (SHARD_MARK in address if not by_key else self._drains()):
            reschedule = sync_to_async(self.reschedule, thread_sensitive=False)
            return await reschedule(message_id, key=key, delay=delay, at=at)
        at_ms, delay_us = due_spec(delay, at)
        due = await store.reschedule(
            message_id=None if by_key else address,
            key=address if by_key else None,
            at_ms=at_ms,
            delay_us=delay_us,
        )
        return due is not None

    async def alookup(self, key: str) -> StoredMessage | None:
        """``lookup`` for async code (the sync store's, in a worker thread)."""
        return await sync_to_async(self.lookup, thread_sensitive=False)(key)

    async def ahistory(self, message_id: str) -> Attempts:
        """``history`` for async code (the sync store's, in a worker thread)."""
        return await sync_to_async(self.history, thread_sensitive=False)(message_id)

    async def amessage(
        self, message_id: str, *, preview_bytes: int | None = None
    ) -> StoredMessage | None:
        """``message`` for async code (the sync store's, in a worker thread)."""
        message = sync_to_async(self.message, thread_sensitive=False)
        return await message(message_id, preview_bytes=preview_bytes)

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
        layout, or has not read the register of layouts lately (a sync call does, at most
        every LAYOUTS_RECHECK_SECONDS)."""
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
