"""How the consumer loop paces itself when it cannot go on: a backoff after a failure is
not cut short by housekeeping already due, a broken schedule does not make it spin, and
the idle re-check bounds a sleep until a message due much later."""

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.worker import Worker
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(30)

GATE = threading.Event()
STARTED = threading.Event()


def held(message: Message) -> None:
    STARTED.set()
    GATE.wait(10)


@pytest.fixture
def own_redis(settings: Any) -> Iterator[RedisServer]:
    server = RedisServer()
    settings.DELAYQUEUES = {
        "default": {"URL": server.url, "HANDLER": "tests.test_worker_pacing.held"}
    }
    GATE.clear()
    STARTED.clear()
    yield server
    server.close()


def test_a_verdict_that_cannot_be_committed_backs_off_past_the_heartbeat_time(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    queue = get_queue()
    queue.send("hold")
    worker = Worker([(queue, held)], heartbeat_interval=0.3)
    with caplog.at_level(logging.DEBUG, logger="delayqueue_django.worker"):
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        assert STARTED.wait(10)
        own_redis.stop()
        GATE.set()  # the ack now fails, again and again
        time.sleep(2)
        tries = [r for r in caplog.records if r.getMessage().startswith("redis unavailable")]
        worker.request_stop()
        worker.request_stop()
        runner.join(timeout=10)
    # Backoff from 0.1 s doubling: a handful in 2 s, not a busy loop once the heartbeat's
    # time has passed (the housekeeping that would plan the next one never runs).
    assert len(tries) <= 10, len(tries)


def test_a_schedule_whose_ticks_cannot_be_made_does_not_busy_loop_the_consumer(
    own_redis: RedisServer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayqueue_django.schedules.runner import ScheduleRunner

    settings.TASKS = {
        "default": {"BACKEND": "delayqueue_django.tasks.DelayQueueBackend", "QUEUES": ["default"]}
    }
    queue = get_queue()
    queue.schedules.add("sum", every=1, task="tests.task_app.tasks.add", args=[2, 3])
    # This worker's settings carry no backend for the queue: its ticks cannot be made
    # (E049), the schedule is reported broken.
    settings.TASKS = {}
    calls = []
    original = ScheduleRunner.run_due

    def counted(self: ScheduleRunner, now_estimate_ms: float) -> float:
        calls.append(now_estimate_ms)
        return original(self, now_estimate_ms)

    monkeypatch.setattr(ScheduleRunner, "run_due", counted)
    worker = Worker([(queue, held)], heartbeat_interval=10)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    time.sleep(3.5)  # the first tick falls due after 1 s
    looked = len(calls)
    GATE.set()  # (a handler that holds on would keep the stop waiting)
    worker.request_stop()
    runner.join(timeout=10)
    assert looked <= 10, looked


def test_an_idle_worker_rechecks_the_queue_even_with_a_message_due_much_later(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """how-it-works.md: an idle worker re-checks the queue every 30 s (IDLE_RECHECK_SECONDS),
    in case a wake-up was lost; a message due in an hour must not put that off an hour."""
    from delayqueue_django.core.queue import Queue
    from delayqueue_django.worker import consumer

    monkeypatch.setattr(consumer, "IDLE_RECHECK_SECONDS", 0.5)
    queue = get_queue()
    queue.send("later", delay=3600)
    fetches = []
    original = Queue.fetch

    def counted(self: Queue, *args: Any, **kwargs: Any) -> Any:
        fetches.append(time.monotonic())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Queue, "fetch", counted)
    worker = Worker([(queue, held)], heartbeat_interval=10)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    time.sleep(2.6)
    looked = len(fetches)
    worker.request_stop()
    runner.join(timeout=10)
    assert looked >= 3, looked


def test_a_consumer_woken_for_room_and_yet_to_look_is_not_asked_again(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each handler thread done asks the consumers waiting for room; one already woken looks
    # anyway before it sleeps again, so asking it again (its room computed per message,
    # through the whole commit and fetch of a fast drain) only cost the handlers.
    queue = get_queue()
    worker = Worker([(queue, held)])
    [consumer] = worker.consumers
    asked: list[bool] = []

    def has_room() -> bool:
        asked.append(True)
        return True

    monkeypatch.setattr(consumer, "has_room", has_room)
    consumer._woken = False  # as after a look that found no room
    consumer.starved = True
    worker._wake_starved_consumers()
    assert len(asked) == 1
    assert consumer.look_owed()
    worker._wake_starved_consumers()
    assert len(asked) == 1  # woken, yet to look: not asked again
    consumer._event.clear()  # its sleep ended; the look comes next, and sees the room
    assert not consumer.look_owed()
    worker._wake_starved_consumers()
    assert len(asked) == 2
