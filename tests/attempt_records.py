"""Attempt records written where a queue's store keeps them (``<tag>:history``, or the
memory store's dict), packed as the scripts pack them (``engine.history``): for tests of
what reads them, records as a release wrote them or as none does (damaged, foreign)."""

import json
from typing import Any

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.memory.store import MemoryStore
from delayqueue_django.engine.sharding.store import ShardedStore


def record(
    attempt: int,
    error_class: str = "shop.errors.PaymentDown",
    error: str = "the provider said 503",
    *,
    verdict: str = "error",
    traceback: str = 'Traceback (most recent call last):\n  File "shop/tasks.py", line 9\n',
    worker: str = "web-1:4242",
    started_ms: int | None = 1_700_000_000_000,
    ended_ms: int = 1_700_000_001_250,
    cut: str = "",
) -> list[Any]:
    """One attempt record as the store packs it (engine.history)."""
    return [attempt, verdict, error_class, error, traceback, worker, started_ms, ended_ms, cut]


def plant(queue: Queue, message_id: str, records: list[Any] | bytes) -> None:
    """Write a message's attempt records where its store keeps them: a JSON array of packed
    records, or the very bytes given."""
    raw = records if isinstance(records, bytes) else json.dumps(records).encode()
    store: Any = queue.store
    if isinstance(store, ShardedStore):
        store = store.shard_for(message_id)
    if isinstance(store, RedisStore):
        store.client.hset(store.keys.key("history"), message_id.encode(), raw)
    else:
        assert isinstance(store, MemoryStore)
        with store.server.lock:
            store._state().history[message_id] = raw.decode("utf-8", "surrogateescape")
