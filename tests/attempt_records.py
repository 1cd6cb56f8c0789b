"""Dead letters with attempt records for the admin's tests: buried by a refusal that carries
a raised exception (as a worker's verdict does), or records written where the store keeps
them (``<tag>:history``, or the memory store's dict), packed as the scripts pack them
(``engine.history``): as no release writes them (damaged, foreign), or none at all (a dead
letter of a release before them)."""

import json
from typing import Any

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.memory.store import MemoryStore
from delayqueue_django.engine.sharding.store import ShardedStore
from tests.helpers import fetch_when_due


class PaymentDown(Exception):
    """A handler's error, named as the example shop's would be (the docs' screenshots show
    it): the records say "shop.payments.PaymentDown"."""

    __module__ = "shop.payments"


PAYMENT_DOWN = "shop.payments.PaymentDown"


def raised(error: BaseException) -> BaseException:
    """``error`` with a traceback, as a handler's is."""
    try:
        raise error
    except BaseException as caught:
        return caught


def bury_with(queue: Queue, error: BaseException | None, payload: Any = "dead") -> str:
    """A dead letter whose one attempt was refused with ``error`` raised (None: its handler
    returned False), recorded as a worker records it."""
    message_id = queue.send(payload, retry_count=0)
    [message] = [m for m in fetch_when_due(queue) if m.id == message_id]
    failure = None if error is None else raised(error)
    note = queue.attempt_note(message, failure, ran_seconds=0.25)
    queue.nack([message], attempts={message_id: note})
    return message_id


def store_of(queue: Queue, message_id: str) -> Any:
    store: Any = queue.store
    return store.shard_for(message_id) if isinstance(store, ShardedStore) else store


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
    store = store_of(queue, message_id)
    if isinstance(store, RedisStore):
        store.client.hset(store.keys.key("history"), message_id.encode(), raw)
    else:
        assert isinstance(store, MemoryStore)
        with store.server.lock:
            store._state().history[message_id] = raw.decode("utf-8", "surrogateescape")


def forget(queue: Queue, message_id: str) -> None:
    """Remove a message's attempt records, as if it died before a release wrote them."""
    store = store_of(queue, message_id)
    if isinstance(store, RedisStore):
        store.client.hdel(store.keys.key("history"), message_id.encode())
    else:
        assert isinstance(store, MemoryStore)
        with store.server.lock:
            store._state().history.pop(message_id, None)
