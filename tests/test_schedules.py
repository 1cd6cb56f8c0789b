"""Schedules at work, on the memory store's clock (frozen until moved): every tick fired once
by several workers, some replaced mid-way; DST changes; pauses; run-time changes; the missed
policies; settings synced at start; the Tasks backend. (Worker processes killed with kill -9:
the chaos scenario tests/chaos/test_schedules.py, which make test runs at a small size.)"""

import itertools
import logging
import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, assert_type
from zoneinfo import ZoneInfo

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.handlers import resolve
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.queue_schedules import QueueSchedules, ScheduleInfo
from delayqueue_django.engine.records import parse_tick_id
from delayqueue_django.exceptions import InvalidSchedule, UnknownSchedule
from delayqueue_django.schedules.api import Schedules
from delayqueue_django.schedules.definition import RecentTicks, Schedule
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.testing import MemoryQueues, memory_queues

BERLIN = ZoneInfo("Europe/Berlin")
HANDLER = "tests.test_schedules.record"

# (tick ms, payload, due_ms) of every tick handled, by the handler below.
handled: list[tuple[int, Any, int]] = []


def record(message: Message) -> None:
    parsed = parse_tick_id(message.id)
    assert parsed is not None, message.id
    handled.append((parsed[1], message.payload, message.due_ms))


@pytest.fixture(autouse=True)
def _nothing_handled() -> None:
    handled.clear()


def ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def local(ms_: int) -> datetime:
    return datetime.fromtimestamp(ms_ / 1000, tz=BERLIN)


def on_memory(settings: Any, start: datetime, **schedules: Any) -> Any:
    settings.DELAYQUEUES = {
        "default": {"URL": "memory://", "HANDLER": HANDLER, "SCHEDULES": schedules}
    }
    return memory_queues(start=start, schedules=True)


def handle_due(queue: Queue, runner: ScheduleRunner) -> int:
    """What a worker does with due messages: fetch, run the handler unless the schedule
    declines the tick, ack."""
    count = 0
    handler = resolve(queue.config)
    while fetched := queue.fetch().messages:
        for message in fetched:
            if not runner.declines(message):
                handler(message)
        queue.ack(fetched)
        count += len(fetched)
    return count


def times(entries: list[tuple[int, Any, int]]) -> list[int]:
    return [at for at, _, _ in entries]


def test_every_tick_of_a_day_fires_once_with_three_workers_some_replaced(settings: Any) -> None:
    day_start = datetime(2024, 5, 6, tzinfo=UTC)
    start = day_start - timedelta(seconds=30)
    rng = random.Random(17)
    with on_memory(settings, start, poll={"EVERY": 300, "PAYLOAD": {"poll": True}}) as queues:
        queue = get_queue()
        workers = [ScheduleRunner(queue) for _ in range(3)]
        replaced = 0
        while queues.now < day_start + timedelta(days=1) - timedelta(seconds=46):
            for runner in rng.sample(workers, rng.randint(1, 3)):
                runner.run_due(ms(queues.now))
            handle_due(queue, rng.choice(workers))
            if rng.random() < 0.05:
                # A worker gone at a random point (between two of its turns) and a new one
                # started in its place, which knows nothing yet.
                workers[rng.randrange(3)] = ScheduleRunner(queue)
                replaced += 1
            queues.advance(rng.uniform(1, 45))

        queues.advance(day_start + timedelta(days=1) - timedelta(seconds=1) - queues.now)
        handle_due(queue, workers[0])

    day = [ms(day_start) + n * 300_000 for n in range(288)]
    assert sorted(times(handled)) == day
    assert Counter(times(handled)).most_common(1)[0][1] == 1
    assert all(payload == {"poll": True} for _, payload, _ in handled)
    assert all(due == at for at, _, due in handled)  # due_ms is the tick's time
    assert replaced >= 5


def test_a_frozen_clock_fires_nothing_more(settings: Any) -> None:
    start = datetime(2024, 5, 6, 11, 59, 59, tzinfo=UTC)
    with on_memory(settings, start, poll={"EVERY": 60}) as queues:
        queues.run_due()
        queues.advance(1)
        for _ in range(5):
            queues.run_due()
        assert times(handled) == [ms(datetime(2024, 5, 6, 12, tzinfo=UTC))]
        [pending] = get_queue().list_messages("pending")
        assert pending.id == f"tick:poll:{ms(datetime(2024, 5, 6, 12, 1, tzinfo=UTC))}"


def run_through(queues: MemoryQueues, until: datetime, step: timedelta) -> None:
    while queues.now < until:
        queues.advance(step)
        queues.run_due()


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        # Spring forward (02:00 -> 03:00): 02:30 does not exist that night; the tick fires at
        # 03:00, as Debian's cron runs it, neither skipped nor twice.
        (
            datetime(2024, 3, 30, 12, tzinfo=BERLIN),
            ["2024-03-31 03:00 +0200", "2024-04-01 02:30 +0200", "2024-04-02 02:30 +0200"],
        ),
        # Fall back (03:00 -> 02:00): 02:30 happens twice that night; the tick fires once.
        (
            datetime(2024, 10, 26, 12, tzinfo=BERLIN),
            ["2024-10-27 02:30 +0200", "2024-10-28 02:30 +0100", "2024-10-29 02:30 +0100"],
        ),
    ],
)
def test_a_daily_cron_across_a_dst_change_fires_once_a_day(
    settings: Any, start: datetime, expected: list[str]
) -> None:
    with on_memory(
        settings, start, nightly={"CRON": "30 2 * * *", "TIME_ZONE": "Europe/Berlin"}
    ) as queues:
        run_through(queues, start + timedelta(days=3), timedelta(minutes=1))
    assert [local(at).strftime("%Y-%m-%d %H:%M %z") for at in times(handled)] == expected


@pytest.mark.parametrize(
    ("day", "hours"),
    [(datetime(2024, 3, 31, tzinfo=BERLIN), 23), (datetime(2024, 10, 27, tzinfo=BERLIN), 25)],
)
def test_an_hourly_cron_fires_every_real_hour_across_a_dst_change(
    settings: Any, day: datetime, hours: int
) -> None:
    start = day - timedelta(minutes=1)
    with on_memory(
        settings, start, hourly={"CRON": "0 * * * *", "TIME_ZONE": "Europe/Berlin"}
    ) as queues:
        # The day's ticks, its first midnight's to its 23:00's (the clock stops at 23:59).
        run_through(queues, day + timedelta(days=1) - timedelta(seconds=90), timedelta(minutes=1))
    fired = times(handled)
    assert fired[0] == ms(day)  # stored at the block's start: its first tick is midnight's
    assert len(fired) == len(set(fired)) == hours
    # One real hour apart, all through the change.
    assert {later - earlier for earlier, later in itertools.pairwise(fired)} == {3_600_000}


def test_a_paused_schedule_fires_nothing_and_resumes_from_the_next_tick(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start) as queues:
        queue = get_queue()
        queue.schedules.add("poll", every=60, payload="p")
        run_through(queues, start + timedelta(minutes=2), timedelta(seconds=10))
        assert len(handled) == 2
        info = queue.schedules.pause("poll")
        assert (info.paused, info.next_run, info.next_id) == (True, None, None)
        assert queue.list_messages("pending") == []
        run_through(queues, start + timedelta(minutes=10), timedelta(seconds=10))
        assert len(handled) == 2

        resumed = queue.schedules.resume("poll")
        assert resumed.next_run == start + timedelta(minutes=11)
        run_through(queues, start + timedelta(minutes=13), timedelta(seconds=10))
    minutes = [(at - ms(start)) // 60_000 for at in times(handled)]
    assert minutes == [1, 2, 11, 12, 13]


def test_a_due_tick_still_waiting_when_paused_fires_nothing(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start) as queues:
        queue = get_queue()
        queue.schedules.add("poll", every=60, payload="p")
        runner = ScheduleRunner(queue)
        queues.advance(61)
        runner.run_due(ms(queues.now))  # 12:01 falls due: 12:02 is written
        # Paused before a fetch took the 12:01 tick (the queue was busy, say).
        queue.schedules.pause("poll")
        assert queue.list_messages("pending") == []
        queues.advance(120)
        runner.run_due(ms(queues.now))
        handle_due(queue, runner)
    assert handled == []


def test_queue_schedules_is_typed_by_the_cores_protocol(settings: Any) -> None:
    """Regression: ``Queue.schedules`` was typed Any, so mypy checked no call of it. The
    core now types it by its protocol (apps.py plugging ``Schedules`` in is checked against
    it), and the assert_type calls fail mypy should that be lost again."""
    with on_memory(settings, datetime(2024, 5, 6, 12, tzinfo=UTC)):
        schedules = get_queue().schedules
        assert_type(schedules, QueueSchedules)
        assert isinstance(schedules, Schedules)
        info = assert_type(schedules.add("poll", every=60, payload=1), ScheduleInfo)
        assert info.schedule is not None
        assert assert_type(info.schedule.describe(), str) == "every 60 s"
        assert assert_type(info.schedule.every_ms, int | None) == 60_000
        assert assert_type(schedules.remove("poll"), bool)


def test_a_resume_racing_a_change_writes_the_new_definitions_tick(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start):
        queue = get_queue()
        schedules = queue.schedules
        assert isinstance(schedules, Schedules)  # (its _read is the wing's own)
        schedules.add("poll", every=60, payload="old")
        schedules.pause("poll")
        read = schedules._read

        def read_then_changed_elsewhere(name: str) -> Any:
            found = read(name)
            monkeypatch.undo()
            # Another process changes it between this read and the resume's write.
            queue.schedules.change("poll", every=3600, payload="new")
            return found

        monkeypatch.setattr(schedules, "_read", read_then_changed_elsewhere)
        resumed = schedules.resume("poll")
        hour = f"tick:poll:{ms(start + timedelta(hours=1))}"
        assert (resumed.paused, resumed.next_id) == (False, hour)
        assert [entry.id for entry in queue.list_messages("pending")] == [hour]
        assert queue.peek(hour).payload == '"new"'  # type: ignore[union-attr]


def test_a_schedule_changed_at_run_time_fires_on_the_new_cron_only(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start) as queues:
        queue = get_queue()
        queue.schedules.add("report", cron="* * * * *", time_zone="UTC", payload={"v": 1})
        run_through(queues, start + timedelta(minutes=3, seconds=30), timedelta(seconds=10))
        queue.schedules.change("report", cron="*/5 * * * *", payload={"v": 2})
        # Another worker that still knows the old definition comes along: refused (stale).
        run_through(queues, start + timedelta(minutes=21), timedelta(seconds=10))
    fired = [((at - ms(start)) // 60_000, payload) for at, payload, _ in handled]
    assert fired == [
        (1, {"v": 1}),
        (2, {"v": 1}),
        (3, {"v": 1}),
        (5, {"v": 2}),
        (10, {"v": 2}),
        (15, {"v": 2}),
        (20, {"v": 2}),
    ]


def test_a_worker_with_the_old_definition_writes_nothing_after_a_change(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start) as queues:
        queue = get_queue()
        queue.schedules.add("report", every=60)
        old = ScheduleRunner(queue)
        old.run_due(ms(queues.now))
        queue.schedules.change("report", every=600)
        queues.advance(61)
        old.run_due(ms(queues.now))  # acts on its old view: refused, then reads afresh
        assert [e.id for e in queue.list_messages("pending")] == [
            f"tick:report:{ms(start + timedelta(minutes=10))}"
        ]


@pytest.mark.parametrize(
    ("missed", "expected_minutes"),
    [
        # Every 5 minutes; workers down from 12:00:30 to 12:32. The tick of 12:05 was written
        # already (it is handed out 27 minutes late); those of 12:10-12:30 never were, and
        # 12:30 too is more than MISSED_AFTER (60 s) late at 12:32.
        ("skip", [35, 40]),
        ("once", [30, 35, 40]),
        ("all", [5, 10, 15, 20, 25, 30, 35, 40]),
    ],
)
def test_ticks_missed_while_no_worker_ran_follow_the_policy(
    settings: Any, missed: str, expected_minutes: list[int]
) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start, poll={"EVERY": 300, "MISSED": missed}) as queues:
        run_through(queues, start + timedelta(seconds=30), timedelta(seconds=10))
        queues.advance(timedelta(minutes=31, seconds=30))  # nobody runs meanwhile
        run_through(queues, start + timedelta(minutes=41), timedelta(seconds=10))
    assert [(at - ms(start)) // 60_000 for at in times(handled)] == expected_minutes


def test_a_catch_up_runs_the_latest_missed_limit_ticks_and_logs_those_skipped(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # As above: of the six ticks missed (12:05, written before the workers went down, to
    # 12:30), the latest three run; the others are never written (12:10, 12:15) or not run
    # (12:05).
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with (
        on_memory(settings, start, poll={"EVERY": 300, "MISSED": "all", "MISSED_LIMIT": 3}) as q,
        caplog.at_level(logging.INFO, logger="delayqueue_django.schedules"),
    ):
        run_through(q, start + timedelta(seconds=30), timedelta(seconds=10))
        q.advance(timedelta(minutes=31, seconds=30))
        run_through(q, start + timedelta(minutes=41), timedelta(seconds=10))
    assert [(at - ms(start)) // 60_000 for at in times(handled)] == [20, 25, 30, 35, 40]
    assert (
        "schedule poll of queue default missed more ticks than MISSED_LIMIT=3: 2 from "
        "2024-05-06T12:10:00+00:00 to before 2024-05-06T12:20:00+00:00 skipped, the latest 3 run"
    ) in caplog.text
    five_past = ms(start + timedelta(minutes=5))
    assert (
        f"tick tick:poll:{five_past} of queue default not run: missed (started 1630.0 s "
        "after its time; MISSED=all, MISSED_LIMIT=3)"
    ) in caplog.text


def test_a_catch_up_after_a_long_outage_runs_100_ticks_by_default(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start, poll={"EVERY": 1, "MISSED": "all"}) as queues:
        queues.run_due()  # 12:00:01 written
        queues.advance(timedelta(days=7))  # every worker down for a week: 604,800 ticks
        queues.run_due()
        pending = get_queue().list_messages("pending")
    back = ms(start + timedelta(days=7))
    assert times(handled) == list(range(back - 99_000, back + 1, 1000))
    assert [entry.id for entry in pending] == [f"tick:poll:{back + 1000}"]


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule("q", "*/15 * * * *", None, "Europe/Berlin", "null"),
        Schedule("n", "30 2 * * *", None, "Europe/Berlin", "null"),
        Schedule("e", None, 900_000, "UTC", "null"),
    ],
    ids=["quarter-hourly", "nightly", "every"],
)
def test_the_latest_ticks_are_followed_as_the_clock_moves(schedule: Schedule) -> None:
    # Across the spring-forward night, moving forwards mostly, sometimes back, sometimes far.
    rng = random.Random(5)
    start = ms(datetime(2024, 3, 29, tzinfo=BERLIN))
    recent, moment = RecentTicks(schedule, 7), start
    for _ in range(300):
        moment += rng.choice([rng.randint(0, 600_000), -rng.randint(0, 900_000), 86_400_000])
        expected = schedule.latest_at_or_before(moment)
        for _ in range(6):
            expected = schedule.latest_at_or_before(expected - 1)  # type: ignore[operator]
        assert recent.earliest(moment) == expected, moment
    assert schedule.count_ticks(start, start + 86_400_000, 1000) == len(
        list(itertools.takewhile(lambda at: at < start + 86_400_000, ticks_from(schedule, start)))
    )


def ticks_from(schedule: Schedule, ms_: int) -> Iterator[int]:
    at = schedule.next_after(ms_ - 1)
    while at is not None:
        yield at
        at = schedule.next_after(at)


def test_a_tick_may_start_up_to_missed_after_late_and_still_run(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(
        settings, start, poll={"EVERY": 60, "MISSED": "skip", "MISSED_AFTER": 120}
    ) as queues:
        queues.run_due()
        queues.advance(timedelta(minutes=2, seconds=30))  # the 12:01 tick is 90 s late
        queues.run_due()
    assert [(at - ms(start)) // 60_000 for at in times(handled)] == [1, 2]


def test_settings_are_synced_as_a_worker_starts(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(
        settings,
        start,
        kept={"EVERY": 3600, "PAYLOAD": "kept"},
        changed={"CRON": "0 3 * * *", "TIME_ZONE": "UTC"},
        dropped={"EVERY": 60},
    ) as queues:
        queue = get_queue()
        queue.schedules.add("runtime", every=600)
        old_deploy = ScheduleRunner(queue)
        old_deploy.run_due(ms(queues.now))
        before = {e.id for e in queue.list_messages("pending")}
        assert len(before) == 4

        # The next deploy: one schedule changed, one dropped; workers start while a worker
        # of the old deploy still runs.
        settings.DELAYQUEUES = {
            "default": {
                **settings.DELAYQUEUES["default"],
                "SCHEDULES": {
                    "kept": {"EVERY": 3600, "PAYLOAD": "kept"},
                    "changed": {"CRON": "0 4 * * *", "TIME_ZONE": "UTC"},
                },
            }
        }
        queue = get_queue()
        new_deploy = [ScheduleRunner(queue) for _ in range(2)]
        for runner in new_deploy:  # the second finds everything in place
            runner.run_due(ms(queues.now))
        after = {e.id for e in queue.list_messages("pending")}
        # The dropped one is left to the old worker that still declares it (a worker once
        # removed, as it started, every schedule of settings its own lacked).
        names = sorted(info.name for info in queue.schedules.all())
        assert names == ["changed", "dropped", "kept", "runtime"]

        # The old worker stops; the dropped schedule is removed once no worker has declared
        # it for UNDECLARED_MS, not before.
        declared_last = queues.now
        run_through_with(queues, new_deploy, declared_last + timedelta(minutes=4))
        assert "dropped" in {info.name for info in queue.schedules.all()}
        run_through_with(queues, new_deploy, declared_last + timedelta(minutes=6))
        names = sorted(info.name for info in queue.schedules.all())
    assert names == ["changed", "kept", "runtime"]
    tomorrow = datetime(2024, 5, 7, tzinfo=UTC)
    assert after == {
        f"tick:kept:{ms(start + timedelta(hours=1))}",
        f"tick:changed:{ms(tomorrow + timedelta(hours=4))}",
        f"tick:runtime:{ms(start + timedelta(minutes=10))}",
        f"tick:dropped:{ms(start + timedelta(minutes=1))}",
    }
    assert before - after == {f"tick:changed:{ms(tomorrow + timedelta(hours=3))}"}


def run_through_with(queues: MemoryQueues, runners: list[ScheduleRunner], until: datetime) -> None:
    """The workers' schedule passes every 10 s until ``until`` (the ticks are not run)."""
    while queues.now < until:
        queues.advance(10)
        for runner in runners:
            runner.run_due(ms(queues.now))


def test_the_api_tells_where_a_schedule_stands(settings: Any) -> None:
    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start, nightly={"CRON": "0 3 * * *", "TIME_ZONE": "UTC"}) as queues:
        queue = get_queue()
        info = queue.schedules.add("poll", every=timedelta(minutes=1), payload={"a": 1})
        assert (info.name, info.source, info.paused, info.last_run) == ("poll", "api", False, None)
        assert info.next_run == start + timedelta(minutes=1)
        assert info.next_id == f"tick:poll:{ms(start + timedelta(minutes=1))}"
        assert info.schedule is not None
        assert info.schedule.describe() == "every 60 s"
        run_through(queues, start + timedelta(minutes=2), timedelta(seconds=10))
        info = queue.schedules.get("poll")
        assert (info.last_run, info.next_run) == (
            start + timedelta(minutes=2),
            start + timedelta(minutes=3),
        )
        assert queue.schedules.get("nightly").source == "settings"

        with pytest.raises(InvalidSchedule, match="has a schedule named 'poll' already"):
            queue.schedules.add("poll", every=5)
        with pytest.raises(InvalidSchedule, match="is declared in settings; change it there"):
            queue.schedules.change("nightly", cron="0 4 * * *")
        with pytest.raises(InvalidSchedule, match=r"schedule 'x' of queue 'default': cron="):
            queue.schedules.add("x", cron="every day")
        with pytest.raises(UnknownSchedule, match="no schedule named 'nope'"):
            queue.schedules.pause("nope")
        with pytest.raises(TypeError, match="unexpected keyword"):
            queue.schedules.change("poll", crontab="x")
        assert queue.schedules.remove("poll") is True
        assert queue.schedules.remove("poll") is False
        assert [info.name for info in queue.schedules.all()] == ["nightly"]


def test_the_api_takes_a_missed_limit_with_missed_all(settings: Any) -> None:
    with on_memory(settings, datetime(2024, 5, 6, 12, tzinfo=UTC)):
        schedules = get_queue().schedules
        added = schedules.add("poll", every=60, missed="all", missed_limit=5).schedule
        assert added is not None
        assert (added.missed, added.missed_limit) == ("all", 5)
        changed = schedules.change("poll", every=120).schedule
        assert changed is not None
        assert changed.missed_limit == 5
        changed = schedules.change("poll", missed="once").schedule
        assert changed is not None
        assert changed.missed_limit == 100
        with pytest.raises(InvalidSchedule, match=r"sets MISSED_LIMIT with MISSED 'once'"):
            schedules.change("poll", missed_limit=7)
        with pytest.raises(InvalidSchedule, match=r"missed_limit= must be a whole number"):
            schedules.add("other", every=60, missed="all", missed_limit=0)


@pytest.fixture
def task_schedule(settings: Any) -> Iterator[MemoryQueues]:
    from tests.task_app import tasks

    tasks.calls.clear()
    settings.DELAYQUEUES = {
        "default": {
            "URL": "memory://",
            "SCHEDULES": {
                "sum": {"EVERY": 60, "TASK": "tests.task_app.tasks.add", "ARGS": [2, 3]},
            },
        }
    }
    settings.TASKS = {
        "default": {"BACKEND": "delayqueue_django.tasks.DelayQueueBackend", "QUEUES": ["default"]}
    }
    with memory_queues(start=datetime(2024, 5, 6, 12, tzinfo=UTC), schedules=True) as queues:
        yield queues


def test_a_schedule_can_enqueue_a_task(task_schedule: MemoryQueues) -> None:
    from tests.task_app import tasks

    run_through(task_schedule, task_schedule.now + timedelta(minutes=2), timedelta(seconds=20))
    assert tasks.calls == [("add", (2, 3)), ("add", (2, 3))]
    tick = f"tick:sum:{ms(datetime(2024, 5, 6, 12, 2, tzinfo=UTC))}"
    result = tasks.add.get_result(tick)
    assert (result.return_value, result.status) == (5, "SUCCESSFUL")
    assert result.task.run_after == datetime(2024, 5, 6, 12, 2, tzinfo=UTC)


def test_a_worker_thread_fires_ticks_as_the_clock_moves(settings: Any) -> None:
    from delayqueue_django.worker import start_worker_thread
    from tests.helpers import wait_for

    start = datetime(2024, 5, 6, 12, tzinfo=UTC)
    with on_memory(settings, start, poll={"EVERY": 60}) as queues:
        worker = start_worker_thread()
        try:
            wait_for(lambda: get_queue().list_messages("pending"), what="the first tick")
            for minute in range(1, 4):
                queues.advance(60)

                def fired(expected: int = minute) -> bool:
                    return len(handled) == expected

                wait_for(fired, what=f"tick {minute}")
        finally:
            worker.stop()
    assert [(at - ms(start)) // 60_000 for at in times(handled)] == [1, 2, 3]
