"""asend, acancel and astats: redis.asyncio for URL queues, a thread for django-redis aliases
and memory queues."""

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import delayqueue_django as delayqueue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.async_store import AsyncRedisStore
from delayqueue_django.exceptions import InvalidDelay, PayloadEncodingError
from tests.redis_servers import RedisServer


def test_send_cancel_and_stats_from_async_code(redis_configure: Callable[..., Queue]) -> None:
    queue = redis_configure()

    async def scenario() -> tuple[str, bool, bool, dict[str, int]]:
        assert isinstance(queue.async_store(), AsyncRedisStore)  # native, not a thread
        message_id = await queue.asend({"order": 7}, delay=60)
        stats = await queue.astats()
        cancelled = await queue.acancel(message_id)
        again = await queue.acancel(message_id)
        return message_id, cancelled, again, stats

    message_id, cancelled, again, stats = asyncio.run(scenario())
    assert (stats["pending"], stats["shards_down"]) == (1, 0)  # as stats() has it
    assert (cancelled, again) == (True, False)
    assert queue.peek(message_id) is None


def test_module_level_async_functions(redis_server: RedisServer) -> None:
    async def scenario() -> str:
        message_id = await delayqueue.asend("hello", queue="other", delay=30)
        assert await delayqueue.acancel(message_id, queue="default") is False
        return message_id

    message_id = asyncio.run(scenario())
    [entry] = delayqueue.get_queue("other").list_messages("pending")
    assert entry.id == message_id


def test_a_django_redis_alias_falls_back_to_a_thread(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"REDIS": "redis"}}
    queue = delayqueue.get_queue()

    async def scenario() -> tuple[str, int]:
        assert queue.async_store() is None
        message_id = await queue.asend("through the cache's pool")
        return message_id, (await queue.astats())["pending"]

    message_id, pending = asyncio.run(scenario())
    assert pending == 1
    assert queue.peek(message_id) is not None


def test_bad_input_raises_in_async_code_too(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        with pytest.raises(InvalidDelay):
            await delayqueue.asend("x", delay=-1)
        with pytest.raises(PayloadEncodingError):
            await delayqueue.asend({1, 2})
        with pytest.raises(PayloadEncodingError, match="has keys 1 and '1'"):
            await delayqueue.asend({1: "a", "1": "b"})
        with pytest.raises(PayloadEncodingError, match="has keys True and 'true'"):
            await delayqueue.get_queue().asend_many(["fine", {"x": [{True: 1, "true": 2}]}])

    asyncio.run(scenario())
    assert redis_server.client().dbsize() == 0


def test_asend_does_not_block_the_event_loop(redis_server: RedisServer) -> None:
    queue = delayqueue.get_queue()

    async def scenario() -> int:
        await queue.astats()  # connect and load the scripts first
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        redis_server.client().client_pause(400)  # Redis answers nobody for 400 ms
        started = time.monotonic()
        await queue.asend("waits for Redis")
        assert time.monotonic() - started >= 0.3
        stop.set()
        await ticking
        return ticks

    assert asyncio.run(scenario()) >= 10  # the loop ran other work while asend waited


def test_each_event_loop_gets_its_own_client(redis_server: RedisServer) -> None:
    """redis.asyncio clients belong to their loop: reusing one after its loop closed fails."""
    queue = delayqueue.get_queue()

    async def client_used() -> Any:
        await queue.astats()
        store = queue.async_store()
        assert store is not None
        return store.client

    first = asyncio.run(client_used())
    second = asyncio.run(client_used())  # a new loop, after the first one closed
    assert second is not first


def test_a_memory_queue_works_from_async_code(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    queue = delayqueue.get_queue()

    async def scenario() -> tuple[bool, dict[str, int]]:
        assert queue.async_store() is None  # no asyncio client: the sync calls in a thread
        message_id = await queue.asend({"order": 7}, delay=60)
        stats = await queue.astats()
        return await queue.acancel(message_id), stats

    cancelled, stats = asyncio.run(scenario())
    assert cancelled
    assert stats["pending"] == 1
    assert queue.stats()["pending"] == 0
