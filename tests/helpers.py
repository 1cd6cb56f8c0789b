"""Small helpers shared by the tests."""

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import STATES, RedisStore
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.exceptions import QueueUnavailable


def wait_for(condition: Callable[[], Any], *, timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll until ``condition()`` is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def fetch_when_due(queue: Queue, count: int | None = None, timeout: float = 5.0) -> list[Any]:
    """Fetch until something is handed out (the message's delay has to pass first)."""
    return list(wait_for(lambda: queue.fetch(count).messages, timeout=timeout, what="a delivery"))


def states_of(queue: Queue, message_id: str) -> list[str]:
    """Every state whose listing holds the id, once per time it is there: a healthy message
    is in exactly one. Read through the store's listings, so it holds for every store."""
    found = []
    for state in STATES:
        offset = 0
        while page := queue.list_messages(state, offset=offset, limit=1000, preview_bytes=0):
            found += [state for entry in page if entry.id == message_id]
            offset += len(page)
    return found


def store_time_ms(queue: Queue) -> int:
    """The queue's clock (Redis's TIME, or the memory store's clock)."""
    return queue.stats()["server_time_ms"]


def redis_store(queue: Queue) -> RedisStore:
    """The queue's store (of shard 0), for tests about Redis itself (keys, scripts,
    pub/sub)."""
    store = parts(queue.store)["0"]
    assert isinstance(store, RedisStore), f"{queue!r} is not on Redis"
    return store


def short_lock_waits(alias: str) -> None:
    """Waits for a row lock on ``alias``'s connection in this thread give up after 2 s,
    instead of hanging a test (or waiting innodb_lock_wait_timeout, 50 s)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 2")
        else:
            cursor.execute("SET lock_timeout = '2s'")


def send_what_reaches_redis(queue: Queue, count: int) -> int:
    """Sends ``count`` messages to a queue some of whose shards cannot be reached (each
    goes to a shard at random): how many were sent."""
    sent = 0
    for n in range(count):
        try:
            queue.send({"n": n}, delay=60)
        except QueueUnavailable:
            continue
        sent += 1
    return sent


def asked_for_stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tags of the shards whose stats are asked of Redis from now on, in order."""
    asked: list[str] = []
    real = RedisStore.stats

    def stats(store: RedisStore) -> dict[str, int]:
        asked.append(store.keys.tag)
        return real(store)

    monkeypatch.setattr(RedisStore, "stats", stats)
    return asked
