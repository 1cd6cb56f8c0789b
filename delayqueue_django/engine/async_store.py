"""The producer side of the store on redis.asyncio: send, cancel, reschedule, lookup and
stats without blocking an event loop. It runs the same scripts, with the same arguments and
replies, as RedisStore."""

import asyncio
from collections.abc import Sequence
from typing import Any, TypeAlias

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ResponseError

from delayqueue_django.engine.keyed_calls import (
    cancel_key_args,
    cancelled_id,
    duplicate_key,
    keyed_sent,
    reschedule_args,
    rescheduled_due,
    send_keyed_calls,
    wire,
)
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.outcomes import outcome_arg
from delayqueue_django.engine.records import KeyedSent, NewMessage, StoredMessage, StoreLimits
from delayqueue_django.engine.scripts import AsyncLua, send_keys
from delayqueue_django.engine.store.base import log_warnings, oldest_version, require_supported
from delayqueue_django.engine.store.calls import one_send_call, send_calls, send_error, sent_alone
from delayqueue_django.engine.store.replies import described, parse_stats, removed_state

AsyncRedisClient: TypeAlias = AsyncRedis | AsyncRedisCluster


class AsyncRedisStore:
    def __init__(self, client: AsyncRedisClient, keys: QueueKeys, limits: StoreLimits) -> None:
        self.client = client
        self.keys = keys
        self.limits = limits
        self._layout = keys.layout
        self._lua = AsyncLua(client)
        self._channel = keys.wakeup_channel
        cluster = isinstance(client, AsyncRedisCluster)
        self._send_call = self._lua.bound("send", send_keys(self._layout, cluster=cluster))
        self._version_checked = False
        self._version_lock = asyncio.Lock()

    async def check_server(self) -> None:
        if self._version_checked:
            return
        async with self._version_lock:
            if not self._version_checked:
                info = await self.client.info("server")
                require_supported(oldest_version(info), self.keys.queue)
                self._version_checked = True

    async def _run(self, name: str, args: Sequence[Any]) -> Any:
        await self.check_server()
        reply = await self._lua(name, self._layout, args)
        log_warnings(self.keys.queue, reply[-1])
        return reply

    async def send(self, messages: Sequence[NewMessage]) -> list[int]:
        """Schedule messages, one round trip per SEND_BATCH_SIZE chunk."""
        alone = sent_alone(messages)
        if alone is not None:
            return [await self._send_one(alone)]
        calls = send_calls(self._channel, messages, self.limits.send_batch_size)
        try:
            await self.check_server()
            replies = [await self._send_call(args) for args in calls]
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        for reply in replies:
            log_warnings(self.keys.queue, reply[-1])
        return [int(due) for reply in replies for due in reply[:-1]]

    async def _send_one(self, message: NewMessage) -> int:
        """RedisStore._send_one, awaited."""
        await self.check_server()
        args = one_send_call(self._channel, message)
        try:
            due, warnings = await self._send_call(args)
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        if warnings:
            log_warnings(self.keys.queue, warnings)
        return int(due)

    async def send_keyed(self, messages: Sequence[NewMessage]) -> list[KeyedSent]:
        """Schedule keyed messages, chunk by chunk as RedisStore.send_keyed does."""
        sent: list[KeyedSent] = []
        channel, batch_size = self.keys.wakeup_channel, self.limits.send_batch_size
        for chunk, args in send_keyed_calls(channel, messages, batch_size):
            try:
                reply = await self._run("send_keyed", args)
            except ResponseError as error:
                raise duplicate_key(error, chunk) or send_error(error, self.keys.queue) from None
            sent += keyed_sent(reply[:-1])
        return sent

    async def remove(self, message_id: str) -> str | None:
        """Cancel a waiting message; returns the state it left, or None."""
        ended = outcome_arg(self.limits)  # ARGV[5] (see RedisStore.remove)
        args = [message_id, "cancel", *(["", "", *ended] if ended else [])]
        return removed_state(await self._run("remove", args))

    async def cancel_key(self, key: str) -> str | None:
        """Cancel the key's message if it waits; returns its id, or None."""
        args = [*cancel_key_args(key), *outcome_arg(self.limits)]
        return cancelled_id(await self._run("remove", args))

    async def reschedule(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        at_ms: int | None = None,
        delay_us: int = 0,
    ) -> int | None:
        """A waiting message's new due time (see RedisStore.reschedule), or None."""
        args = reschedule_args(self.keys.wakeup_channel, message_id, key, at_ms, delay_us)
        return rescheduled_due(await self._run("reschedule", args))

    async def lookup(self, key: str) -> StoredMessage | None:
        """The key's message, as RedisStore.lookup finds it, or None."""
        message_id, *reply = await self._run("lookup", [wire(key)])
        return described(message_id, reply) if message_id else None

    async def stats(self) -> dict[str, int]:
        return parse_stats(await self._run("stats", []))
