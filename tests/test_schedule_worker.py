"""Schedules in a worker running on a real Redis, timed by the wall clock: a schedule added or
resumed at run time ticks on time from its first tick on; a worker whose settings lack a
schedule leaves it to the workers that declare it; a Redis that lost its data gets the
settings' schedules back at once."""

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.engine.records import parse_tick_id
from delayqueue_django.schedules.runner import syncing as runner
from delayqueue_django.worker import start_worker_thread
from delayqueue_django.worker.in_process import WorkerThread
from tests.helpers import redis_store, store_time_ms, wait_for
from tests.redis_servers import RedisServer

HANDLER = "tests.test_schedule_worker.record"

# (schedule name, tick ms, when its handler started: ms of the wall clock) of every tick run.
ticks: list[tuple[str, int, float]] = []
ticked = threading.Condition()


def record(message: Message) -> None:
    parsed = parse_tick_id(message.id)
    assert parsed is not None, message.id
    with ticked:
        ticks.append((parsed[0], parsed[1], time.time() * 1000))
        ticked.notify_all()


def ticks_of(name: str) -> list[tuple[int, float]]:
    with ticked:
        return [(at, started) for each, at, started in ticks if each == name]


def wait_for_ticks(name: str, count: int, *, timeout: float) -> list[tuple[int, float]]:
    """The first ``count`` ticks of ``name``; fails if they do not all run within
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with ticked:
        while len(found := ticks_of(name)) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(found)} tick(s) of {name} in {timeout} s: {found}")
            ticked.wait(left)
    return found[:count]


def assert_on_time(found: list[tuple[int, float]], *, every_ms: int) -> None:
    """One tick per period, none skipped, each started within a second of its time (a
    generous bound on a loaded machine: the defect was ticks up to 27 s late, in bursts)."""
    times = [at for at, _ in found]
    assert [b - a for a, b in itertools.pairwise(times)] == [every_ms] * (len(times) - 1)
    late = [round(started - at) for at, started in found]
    assert max(late) < 1000, late


@pytest.fixture(autouse=True)
def _nothing_ticked() -> None:
    with ticked:
        ticks.clear()


@pytest.fixture
def worker(settings: Any) -> Iterator[WorkerThread]:
    """A worker that has read the queue's schedules: what is added from now on is news to
    it. (Its settings' schedule, hourly, is there to be seen in its view.)"""
    settings.DELAYQUEUES = {
        "default": {
            **settings.DELAYQUEUES["default"],
            "HANDLER": HANDLER,
            "SCHEDULES": {"hourly": {"EVERY": 3600}},
        }
    }
    with start_worker_thread("default", concurrency=2) as thread:
        [consumer] = thread.worker.consumers
        wait_for(consumer.schedules.schedules, what="the worker's first read of the schedules")
        yield thread


def test_a_schedule_added_at_run_time_ticks_on_time_from_its_first_tick(
    worker: WorkerThread,
) -> None:
    get_queue().schedules.add("poll", every=1)
    # Before workers learnt of it at once, the first tick ran, then nothing until the
    # worker's 30 s re-read, then the missed ticks in a burst.
    assert_on_time(wait_for_ticks("poll", 5, timeout=10), every_ms=1000)


def test_a_resumed_schedule_ticks_on_time_from_its_first_tick(worker: WorkerThread) -> None:
    schedules = get_queue().schedules
    schedules.add("poll", every=1)
    wait_for_ticks("poll", 2, timeout=10)
    schedules.pause("poll")
    paused_at = time.time() * 1000
    time.sleep(1.5)
    schedules.resume("poll")
    assert [at for at, _ in ticks_of("poll") if at > paused_at] == []
    count = len(ticks_of("poll"))
    found = wait_for_ticks("poll", count + 4, timeout=10)[count:]
    assert found[0][0] > paused_at
    assert_on_time(found, every_ms=1000)


def with_schedules(settings: Any, url: str, **schedules: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": url, "HANDLER": HANDLER, "SCHEDULES": schedules}}


def schedule_names() -> set[str]:
    return {info.name for info in get_queue().schedules.all()}


def test_a_worker_without_a_schedule_in_its_settings_leaves_it_to_those_that_declare_it(
    settings: Any, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "REFRESH_MS", 500)
    monkeypatch.setattr(runner, "UNDECLARED_MS", 3000)
    with_schedules(settings, redis_server.url, poll={"EVERY": 1})
    declaring = start_worker_thread("default")
    try:
        wait_for_ticks("poll", 2, timeout=10)
        # An old deploy, or a worker for other work, starts: its settings lack "poll".
        with_schedules(settings, redis_server.url, hourly={"EVERY": 3600})
        with start_worker_thread("default") as other:
            [consumer] = other.worker.consumers
            wait_for(consumer.schedules.schedules, what="the other worker's first read")
            # It once removed "poll" as it started, for good: no tick came again.
            count = len(ticks_of("poll"))
            assert_on_time(wait_for_ticks("poll", count + 3, timeout=10), every_ms=1000)

            # The last worker declaring it stops: "poll" goes once none has declared it for
            # UNDECLARED_MS, not before (measured from a declaration read before the stop:
            # the last one is that or later).
            store = redis_store(get_queue())
            declared = store.client.hget(store.keys.key("schedule_declared"), "poll")
            assert declared is not None
            declaring.stop()
            wait_for(lambda: "poll" not in schedule_names(), timeout=15, what="poll retired")
            assert store_time_ms(get_queue()) - int(declared) >= 3000
    finally:
        declaring.stop()


def test_a_worker_stores_its_schedules_again_once_redis_lost_its_data(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer()
    try:
        with_schedules(settings, server.url, poll={"EVERY": 1})
        with start_worker_thread("default"):
            wait_for_ticks("poll", 2, timeout=10)
            server.restart()  # no persistence: Redis comes back empty
            restarted_at = time.time() * 1000

            def since_the_restart() -> list[tuple[int, float]]:
                return [tick for tick in ticks_of("poll") if tick[0] > restarted_at]

            # Once, no tick came again until the worker restarted.
            wait_for(lambda: len(since_the_restart()) >= 3, timeout=15, what="3 new ticks")
        assert_on_time(since_the_restart()[:3], every_ms=1000)
        assert "Redis lost its data" in caplog.text
    finally:
        server.close()


def test_an_idle_worker_stores_its_schedules_again_as_redis_answers_after_losing_its_data(
    settings: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No tick falls due and no re-read comes for long: only the lost connection can tell.
    monkeypatch.setattr(runner, "REFRESH_MS", 600_000)
    server = RedisServer()
    try:
        with_schedules(settings, server.url, hourly={"EVERY": 3600})
        get_queue().schedules.add("nightly", every=86400, payload={"do": "ok"})
        with start_worker_thread("default") as worker:
            [consumer] = worker.worker.consumers
            wait_for(consumer.schedules.schedules, what="the worker's first read")
            server.restart()  # no persistence: Redis comes back empty
            wait_for(lambda: "hourly" in schedule_names(), timeout=10, what="hourly stored")
        assert "Redis lost its data" in caplog.text
        # A schedule added at run time cannot be stored again by a worker: its loss is said.
        assert "the schedule(s) nightly, added at run time, went with Redis's data" in caplog.text
        assert "nightly" not in schedule_names()
    finally:
        server.close()
