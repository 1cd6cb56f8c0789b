"""A queue whose Redis cannot be reached: every call raises QueueUnavailable, which says where
(never with a password), is a DelayQueueError and still a redis ConnectionError."""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.db import transaction

import delayqueue_django as delayqueue
from delayqueue_django.exceptions import DelayQueueError, QueueTimedOut, QueueUnavailable
from tests.helpers import asked_for_stats
from tests.redis_servers import RedisServer, free_port


@pytest.fixture
def down_port(settings: Any) -> int:
    """The default queue on a URL where nobody listens (with a password, never to be shown)."""
    port = free_port()
    settings.DELAYQUEUES = {"default": {"URL": f"redis://user:s3cret@127.0.0.1:{port}/0"}}
    return port


def says_refused(error: QueueUnavailable, port: int) -> bool:
    """Our words, then redis-py's (which differ between its sync and asyncio clients)."""
    return str(error) == (
        f"queue 'default' cannot reach Redis at 127.0.0.1:{port}: {error.__cause__}"
    ) and str(error.__cause__).startswith(f"Error 111 connecting to 127.0.0.1:{port}.")


CALLS: dict[str, Callable[[], Any]] = {
    "send": lambda: delayqueue.send({"order": 1}),
    "send_many": lambda: delayqueue.get_queue().send_many([1, 2]),
    "cancel": lambda: delayqueue.cancel("x" * 16),
    "stats": lambda: delayqueue.get_queue().stats(),
    "fetch": lambda: delayqueue.get_queue().fetch(1),
    "peek": lambda: delayqueue.get_queue().peek("x" * 16),
    "purge_garbage": lambda: delayqueue.get_queue().purge_garbage(),
    "asend": lambda: asyncio.run(delayqueue.asend({"order": 1})),
    "acancel": lambda: asyncio.run(delayqueue.acancel("x" * 16)),
    "astats": lambda: asyncio.run(delayqueue.get_queue().astats()),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_every_call_raises_queue_unavailable_saying_where(
    down_port: int, call: Callable[[], Any]
) -> None:
    with pytest.raises(QueueUnavailable) as caught:
        call()
    assert says_refused(caught.value, down_port)
    assert "s3cret" not in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    assert not isinstance(caught.value.__cause__, DelayQueueError)
    # The package's error, and still the one code around a send may already catch.
    assert isinstance(caught.value, DelayQueueError)
    assert isinstance(caught.value, redis.ConnectionError)
    assert not isinstance(caught.value, QueueTimedOut)


@pytest.mark.django_db(transaction=True)
def test_a_send_on_commit_raises_it_from_the_commit(down_port: int) -> None:
    with pytest.raises(QueueUnavailable) as caught, transaction.atomic():
        delayqueue.send({"order": 1}, on_commit=True)
    assert says_refused(caught.value, down_port)


def test_a_queue_on_a_cache_alias_names_the_caches_server(settings: Any) -> None:
    port = free_port()
    settings.CACHES = {
        **settings.CACHES,
        "down": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://:s3cret@127.0.0.1:{port}/2",
        },
    }
    settings.DELAYQUEUES = {"default": {"REDIS": "down"}}
    with pytest.raises(QueueUnavailable) as caught:
        delayqueue.send("x")
    assert str(caught.value).startswith(f"queue 'default' cannot reach Redis at 127.0.0.1:{port}: ")
    assert "s3cret" not in str(caught.value)


def test_a_redis_that_does_not_answer_in_time_raises_queue_timed_out(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "OPTIONS": {"socket_timeout": 0.2}}
    }
    queue = delayqueue.get_queue()
    queue.stats()  # connected, version checked: what follows is the send alone
    redis_server.client().client_pause(1000)  # CLIENT PAUSE: others' commands wait
    with pytest.raises(QueueTimedOut) as caught:
        queue.send("x")
    assert str(caught.value) == (
        f"queue 'default': Redis at 127.0.0.1:{redis_server.port} did not answer in time, so "
        f"the call may or may not have run: {caught.value.__cause__}"
    )
    assert isinstance(caught.value, QueueUnavailable)
    assert isinstance(caught.value, redis.TimeoutError)
    assert isinstance(caught.value.__cause__, redis.TimeoutError)


def test_stats_of_shards_on_a_redis_that_does_not_answer_wait_out_one_timeout_not_one_each(
    settings: Any, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "SHARDS": 6, "OPTIONS": {"socket_timeout": 0.2}}
    }
    queue = delayqueue.get_queue()
    assert queue.stats()["shards_down"] == 0  # connected, layouts read
    asked = asked_for_stats(monkeypatch)
    redis_server.client().client_pause(500)
    # Every shard on the one server: none could be read, which raises as ever.
    with pytest.raises(QueueTimedOut):
        queue.stats()
    assert len(asked) == 1
