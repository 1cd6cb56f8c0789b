"""Catch-ups and pauses on every backend (Redis, a Cluster, Valkey, the memory store,
sharded): a catch-up after a long outage writes and runs at most MISSED_LIMIT ticks, and
a pause or a removal stops every tick not handed out yet, however many are waiting."""

import logging
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.engine.records import Tick, parse_tick_id
from delayqueue_django.message import Message
from delayqueue_django.queue import Queue
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.runner import ScheduleRunner
from tests.helpers import store_time_ms

DAY = 86_400_000


def tick_times(queue: Queue) -> list[int]:
    entries = queue.list_messages("pending", limit=1000)
    return [parse_tick_id(entry.id)[1] for entry in entries]  # type: ignore[index]


def down_since(queue: Queue, days: int, **options: Any) -> int:
    """A run-time schedule firing every day at midnight (UTC) whose latest tick, written
    ``days`` days ago, still waits: every worker has been down since. Returns its time."""
    schedule = Schedule("daily", None, DAY, "UTC", '"d"', source="api", **options)
    last = (store_time_ms(queue) // DAY - days) * DAY
    reply = queue.store.define_schedule(
        "daily",
        schedule.to_json(),
        schedule.fingerprint,
        expect="new",
        start_ms=last - 1,
        first=Tick(last, 0, '"d"'),
    )
    assert reply.status == "defined"
    return last


def catch_up(queue: Queue) -> ScheduleRunner:
    """A worker back: it writes ticks until none is due."""
    runner = ScheduleRunner(queue)
    now = store_time_ms(queue)
    while runner.run_due(now) <= now:
        pass
    return runner


def handle(queue: Queue, runner: ScheduleRunner, fetch: Callable[[], list[Message]]) -> list[int]:
    """Run what ``fetch`` hands out through the worker's guarded handler, ack it; the times
    of the ticks whose handler ran."""
    ran: list[int] = []
    handler = runner.guard(lambda message: ran.append(parse_tick_id(message.id)[1]))  # type: ignore[index]
    while fetched := fetch():
        for message in fetched:
            handler(message)
        queue.ack(fetched)
    return ran


def handle_due(queue: Queue, runner: ScheduleRunner) -> list[int]:
    return handle(queue, runner, lambda: queue.fetch().messages)


def test_a_catch_up_after_a_long_outage_writes_and_runs_at_most_missed_limit_ticks(
    configure: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = configure()
    last = down_since(queue, 1000, missed="all")
    with caplog.at_level(logging.INFO, logger="delayqueue_django.schedules"):
        runner = catch_up(queue)
        today = last + 1000 * DAY
        # The tick that waited, the latest 100 of the 1000 missed since, and tomorrow's.
        latest = list(range(today - 99 * DAY, today + 1, DAY))
        assert tick_times(queue) == [last, *latest, today + DAY]
        assert handle_due(queue, runner) == latest
    assert "missed more ticks than MISSED_LIMIT=100: 900 from " in caplog.text
    assert f"tick tick:daily:{last} of queue default missed" in caplog.text


def test_a_smaller_missed_limit_runs_fewer(configure: Callable[..., Queue]) -> None:
    queue = configure()
    last = down_since(queue, 10, missed="all", missed_limit=3)
    runner = catch_up(queue)
    today = last + 10 * DAY
    assert tick_times(queue) == [last, today - 2 * DAY, today - DAY, today, today + DAY]
    assert handle_due(queue, runner) == [today - 2 * DAY, today - DAY, today]
