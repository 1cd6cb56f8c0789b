"""The producer side of the store on redis.asyncio: send, cancel and stats without blocking
an event loop. It runs the same scripts, with the same arguments and replies, as RedisStore."""

import asyncio
from collections.abc import Sequence
from typing import Any, TypeAlias

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ResponseError

from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.records import NewMessage, StoreLimits
from delayqueue_django.engine.scripts import AsyncLua
from delayqueue_django.engine.store import (
    log_warnings,
    oldest_version,
    parse_stats,
    removed_state,
    require_supported,
    send_calls,
    send_error,
)

AsyncRedisClient: TypeAlias = AsyncRedis | AsyncRedisCluster


class AsyncRedisStore:
    def __init__(self, client: AsyncRedisClient, keys: QueueKeys, limits: StoreLimits) -> None:
        self.client = client
        self.keys = keys
        self.limits = limits
        self._layout = keys.layout
        self._lua = AsyncLua(client)
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
        calls = send_calls(self.keys.wakeup_channel, messages, self.limits.send_batch_size)
        try:
            replies = [await self._run("send", args) for args in calls]
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        return [int(due) for reply in replies for due in reply[:-1]]

    async def remove(self, message_id: str) -> str | None:
        """Cancel a waiting message; returns the state it left, or None."""
        return removed_state(await self._run("remove", [message_id, "cancel"]))

    async def stats(self) -> dict[str, int]:
        return parse_stats(await self._run("stats", []))
