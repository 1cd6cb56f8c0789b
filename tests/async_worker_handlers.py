"""``async def`` handlers for worker subprocesses (tests/test_async_workers.py), beside the sync
ones of tests/worker_handlers.py, whose log they share: each call is recorded as JSON in the
Redis list ``test:log`` on the queue's server, read with ``worker_handlers.read_log``.

They record through an asyncio Redis client, as an async handler should: a sync client would
block the event loop for every record, and the loop watch would report it. The payload says
what to do: ``{"do": "ok" | "sleep" | "sleep-first", "seconds": float}`` ("sleep-first"
sleeps on the first attempt only). Importing this module connects no signal receiver: a
drain counted in Redis script calls (``idle``) sends nothing but the queue's own calls.
"""

import asyncio
import json
import os
import time
from typing import Any

import redis.asyncio

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message

# tests.worker_handlers.LOG_KEY, not imported: that module connects signal receivers.
LOG_KEY = "test:log"

# One client per queue URL, made on the worker's event loop, the only loop that uses it. Its
# pool waits for a free connection: redis-py's default one raises "Too many connections" past
# 100 of them, and a worker runs hundreds of these handlers at once.
_clients: dict[str, redis.asyncio.Redis] = {}


async def record(queue: str, event: str, **fields: Any) -> None:
    url = get_queue(queue).config.url
    assert url is not None, f"queue {queue!r} has no URL"
    client = _clients.get(url)
    if client is None:
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=20)
        client = _clients[url] = redis.asyncio.Redis(connection_pool=pool)
    entry = json.dumps({"event": event, "pid": os.getpid(), "queue": queue, **fields})
    await client.rpush(LOG_KEY, entry)


async def handle(message: Message) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    action = payload.get("do", "ok")
    await record(message.queue, "start", id=message.id, attempt=message.attempt, at=time.time())
    if action == "sleep" or (action == "sleep-first" and message.attempt == 1):
        await asyncio.sleep(payload.get("seconds", 1.0))
    await record(message.queue, "done", id=message.id, attempt=message.attempt)


async def idle(message: Message) -> None:
    """Awaits ``seconds`` (default 1) and records nothing: Redis sees only the worker."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    await asyncio.sleep(payload.get("seconds", 1.0))


def sync_idle(message: Message) -> None:
    """The sync path's counterpart of ``idle`` with no sleep: the same drain, in a thread."""
