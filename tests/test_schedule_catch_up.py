"""Catch-ups and pauses on every backend (Redis, a Cluster, Valkey, the memory store,
sharded): a catch-up after a long outage writes and runs at most MISSED_LIMIT ticks, and
a pause or a removal stops every tick not handed out yet, however many are waiting and
wherever their times lie."""

import logging
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import Tick, parse_tick_id
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.runner import ScheduleRunner
from tests.helpers import store_time_ms, wait_for

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
        first=Tick(last, 2, '"d"'),
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
    """Run what ``fetch`` hands out as the worker does (a tick its schedule declines is not
    run), ack it; the times of the ticks whose handler ran."""
    ran: list[int] = []
    while fetched := fetch():
        for message in fetched:
            if not runner.declines(message):
                ran.append(parse_tick_id(message.id)[1])  # type: ignore[index]
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
    assert f"tick tick:daily:{last} of queue default not run: missed" in caplog.text


def test_a_smaller_missed_limit_runs_fewer(configure: Callable[..., Queue]) -> None:
    queue = configure()
    last = down_since(queue, 10, missed="all", missed_limit=3)
    runner = catch_up(queue)
    today = last + 10 * DAY
    assert tick_times(queue) == [last, today - 2 * DAY, today - DAY, today, today + DAY]
    assert handle_due(queue, runner) == [today - 2 * DAY, today - DAY, today]


@pytest.mark.parametrize("how", ["pause", "remove", "pause and resume", "remove and add again"])
def test_a_pause_or_removal_stops_every_tick_of_a_catch_up_still_waiting(
    configure: Callable[..., Queue], how: str
) -> None:
    queue = configure()
    last = down_since(queue, 10, missed="all")
    runner = catch_up(queue)
    today = last + 10 * DAY
    # A backlog: the tick that waited, the ten missed since, all due, and tomorrow's.
    assert tick_times(queue) == list(range(last, today + DAY + 1, DAY))
    if how.startswith("remove"):
        assert queue.schedules.remove("daily")
    else:
        queue.schedules.pause("daily")
    if how == "pause and resume":
        assert queue.schedules.resume("daily").next_run is not None
    if how == "remove and add again":
        queue.schedules.add("daily", every=DAY / 1000, missed="all", payload="d")
    # Handed out by a worker that has not heard of the pause or removal yet.
    assert handle_due(queue, runner) == []
    assert tick_times(queue) == ([] if how in ("pause", "remove") else [today + DAY])


@pytest.mark.parametrize("how", ["pause", "remove"])
def test_ticks_written_ahead_of_the_clock_stop_with_a_pause_or_removal_too(
    configure: Callable[..., Queue], how: str
) -> None:
    queue = configure()
    schedule = Schedule("fast", None, 1000, "UTC", '"f"', source="api")
    now = store_time_ms(queue)
    queue.store.define_schedule(
        "fast", schedule.to_json(), schedule.fingerprint, expect="new", start_ms=now, first=None
    )
    # Written by a worker whose clock ran ahead of the store's (or after the store's clock
    # stepped back): four ticks not due yet.
    for n in range(1, 5):
        tick = Tick(now + 100 * n, 0, '"f"')
        assert queue.store.write_tick("fast", schedule.fingerprint, tick).status == "written"
    runner = ScheduleRunner(queue)
    if how == "remove":
        queue.schedules.remove("fast")
    else:
        queue.schedules.pause("fast")
    waiting = len(tick_times(queue))
    wait_for(lambda: store_time_ms(queue) > now + 400, what="the ticks' times")
    assert (waiting, handle_due(queue, runner)) == (2, [])


def test_a_tick_handed_out_before_a_pause_runs_its_retries(
    configure: Callable[..., Queue],
) -> None:
    queue = configure()
    today = down_since(queue, 0)
    runner = ScheduleRunner(queue)
    [first] = queue.fetch().messages
    queue.nack([first], delay=0)  # its handler failed: a retry is owed
    queue.schedules.pause("daily")
    assert handle(queue, runner, lambda: queue.fetch().messages) == [today]


def test_a_tick_whose_schedule_cannot_be_read_runs(
    configure: Callable[..., Queue], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Paused with three ticks of a catch-up still waiting; the worker handing them out
    # cannot reach the schedule's Redis: with nothing to judge them by, they run.
    queue = configure()
    last = down_since(queue, 3, missed="all")
    catch_up(queue)
    queue.schedules.pause("daily")
    settings.DELAYQUEUES = {
        **settings.DELAYQUEUES,
        "away": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}},
    }
    away = ScheduleRunner(get_queue("away"))
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.schedules"):
        assert handle_due(queue, away) == [last, last + DAY, last + 2 * DAY]
    assert f"reading schedule daily of queue away failed: its tick tick:daily:{last} " in (
        caplog.text
    )
