"""A send whose reply was lost is sent again by the client (redis-py re-sends after a timeout
or a cut connection when retries are configured, and Redis Cluster clients always do): the
replay is acknowledged, never refused as a duplicate of itself, and writes nothing twice."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from delayqueue_django import get_queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.exceptions import DuplicateMessageId
from delayqueue_django.queue import Queue
from tests.redis_servers import RedisServer


def test_a_replayed_send_is_acknowledged_and_written_once(queue: Queue) -> None:
    batch = [NewMessage("a", '"one"', 3, delay_ms=60_000), NewMessage("b", '"two"', 3)]
    first = queue.store.send(batch)
    queue.fetch(1)  # b is in flight before the replay arrives
    assert queue.store.send(batch) == [first[0], pytest.approx(first[1], abs=5_000)]
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert (report.counts["pending"], report.counts["unack"], report.messages) == (1, 1, 2)


def test_an_id_reused_for_another_payload_is_still_refused(queue: Queue) -> None:
    queue.store.send([NewMessage("a", '"one"', 3)])
    with pytest.raises(DuplicateMessageId):
        queue.store.send([NewMessage("new", '"x"', 3), NewMessage("a", '"other"', 3)])
    assert queue.peek("new") is None


def test_an_id_given_twice_is_judged_per_entry_as_replay_or_duplicate(queue: Queue) -> None:
    # Only direct store calls can do this (Queue makes the ids); every store must agree.
    queue.store.send([NewMessage("a", '"one"', 3)])
    with pytest.raises(DuplicateMessageId):
        queue.store.send(
            [NewMessage("new", '"x"', 3), NewMessage("a", '"one"', 3), NewMessage("a", '"two"', 3)]
        )
    assert queue.peek("new") is None
    stored = queue.peek("a")
    assert stored is not None
    assert stored.payload == '"one"'


@pytest.fixture
def sleepy_redis() -> Iterator[RedisServer]:
    server = RedisServer("--enable-debug-command", "yes")
    yield server
    server.close()


def test_a_send_timing_out_on_a_stalled_redis_is_retried_without_a_false_error(
    sleepy_redis: RedisServer, settings: Any
) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": sleepy_redis.url,
            "OPTIONS": {"socket_timeout": 0.3, "retry": Retry(NoBackoff(), 5)},
        }
    }
    queue = get_queue()
    queue.send("warm-up")  # scripts loaded, server version read
    stall = threading.Thread(
        target=sleepy_redis.client(socket_timeout=5).execute_command, args=("DEBUG", "SLEEP", "1")
    )
    stall.start()
    time.sleep(0.1)
    message_id = queue.send("sent while Redis stalls")  # times out, then is sent again
    stall.join()
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.payload == '"sent while Redis stalls"'
    assert queue.stats()["pending"] == 2
