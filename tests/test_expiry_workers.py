"""Expiry and Postpone with real worker processes (``manage.py run_delayqueue``) on Redis:
expired messages are dead-lettered and announced with ``message_expired``, also when the
announcing worker is killed (-9) before confirming; a postpone uses no attempt, and endless
postpones end as a dead letter with their own reason."""

import signal
import time
from typing import Any

import pytest

from delayqueue_django.engine import EXPIRED, POSTPONED_TOO_OFTEN
from tests.helpers import wait_for
from tests.redis_servers import RedisServer
from tests.test_worker_processes import WorkerProcess, events, queue_for, spawn, workers  # noqa: F401

pytestmark = pytest.mark.timeout(90)
HANDLER = {"DQ_TEST_HANDLER": "tests.expiry_handlers.handle"}
MESSAGES = 20


def test_expired_messages_are_dead_lettered_with_their_signal_and_never_run(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url)
    expiring = queue.send_many([{"n": n} for n in range(MESSAGES)], expires=0.2)
    lasting = queue.send_many([{"n": n} for n in range(MESSAGES)], expires=60)
    time.sleep(0.3)  # the first ones expire before any worker runs
    worker = spawn(workers, redis_server.url, **HANDLER)
    wait_for(lambda: len(events("expired")) == MESSAGES, timeout=30, what="every expiry")
    wait_for(lambda: len(events("done")) == MESSAGES, timeout=30, what="the others handled")
    expired = events("expired")
    assert {entry["id"] for entry in expired} == set(expiring)
    assert {entry["reason"] for entry in expired} == {EXPIRED}
    assert {entry["id"] for entry in events("start")} == set(lasting)
    assert events("dead") == []  # announced as expired, not as exhausted
    stats = queue.stats()
    assert (stats["expired_total"], stats["garbage"], stats["acked_total"]) == (
        MESSAGES,
        MESSAGES,
        MESSAGES,
    )
    wait_for(lambda: queue.stats()["unannounced"] == 0, what="the confirmations")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_the_expiry_signal_survives_a_kill_9_before_its_confirmation(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=1)
    message_id = queue.send({"n": 1}, expires=0.2)
    time.sleep(0.3)
    dying = spawn(
        workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", DQ_TEST_DIE_ON_EXPIRED="1", **HANDLER
    )
    assert dying.wait(timeout=20) == 9  # died inside the receiver, before confirming
    [first] = events("expired")
    assert (first["id"], first["pid"]) == (message_id, dying.pid)
    assert queue.stats()["unannounced"] == 1

    survivor = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", **HANDLER)
    wait_for(lambda: len(events("expired")) == 2, timeout=30, what="the second announcement")
    second = events("expired")[1]
    assert (second["id"], second["pid"], second["payload"]) == (message_id, survivor.pid, {"n": 1})
    wait_for(lambda: queue.stats()["unannounced"] == 0, what="the confirmation")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=20) == 0


def test_a_postponed_message_uses_no_attempt(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    """With no retry at all (RETRY_COUNT 0), a message postponed again and again still runs
    in the end, on its first attempt."""
    queue = queue_for(settings, redis_server.url, RETRY_COUNT=0)
    message_id = queue.send({"do": "postpone-times", "times": 3})
    worker = spawn(workers, redis_server.url, DQ_TEST_RETRY_COUNT="0", **HANDLER)
    [done] = wait_for(lambda: events("done"), timeout=30, what="the message handled")
    starts = events("start")
    assert done["id"] == message_id
    assert len(starts) == 4  # postponed three times, then handled
    assert {entry["attempt"] for entry in starts} == {1}
    stats = queue.stats()
    assert stats["postponed_total"] == 3
    assert (stats["failed_total"], stats["garbage"]) == (0, 0)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_endless_postpones_end_as_a_dead_letter_with_their_reason(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url)
    message_id = queue.send({"do": "postpone"})
    worker = spawn(workers, redis_server.url, **HANDLER)
    [dead] = wait_for(lambda: events("dead"), timeout=60, what="the dead letter")
    assert (dead["id"], dead["reason"]) == (message_id, POSTPONED_TOO_OFTEN)
    # The default MAX_POSTPONES (100), then the postpone that buried it.
    assert len(events("start")) == 101
    assert {entry["attempt"] for entry in events("start")} == {1}
    stored = queue.peek(message_id)
    assert stored is not None
    assert (stored.state, stored.dead_reason) == ("garbage", POSTPONED_TOO_OFTEN)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
