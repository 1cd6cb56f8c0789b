"""One schedule that fails never stalls the queue's others: it is logged once, recorded for
the admin and ``schedules.all()``, and tried again with a backoff, while the others fire
every tick on time. A damaged tick record (a cursor past 2**53) reads alike to Lua and
Python, and is replaced."""

import itertools
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import ScheduleRecord, Tick
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.schedules.runner import state as runner_module
from tests.helpers import store_time_ms

HEALTHY = {"EVERY": 1, "PAYLOAD": "ok"}
# A TASK schedule on a queue no DelayQueueBackend carries (system check E049).
TASK_WITHOUT_BACKEND = {"EVERY": 1, "TASK": "tests.task_app.tasks.add", "ARGS": [2, 3]}
PASSES = 30


def record_of(queue: Queue, name: str) -> ScheduleRecord:
    [record] = [r for r in queue.store.read_schedules()[1] if r.name == name]
    return record


def define_broken(queue: Queue, definition: str, fingerprint: str = "0badf00d") -> None:
    """A schedule stored by hand, or by an older version."""
    queue.store.define_schedule(
        "broken", definition, fingerprint, expect="any", start_ms=0, first=None
    )


def first_pass_ms(queue: Queue) -> int:
    """Half a second into the next second: ahead of the store's clock all along the test
    (each pass moves the runner's clock a second, far more than the pass takes)."""
    return (store_time_ms(queue) // 1000 + 1) * 1000 + 500


def run_passes(queue: Queue, runner: ScheduleRunner, start: int) -> None:
    """A pass a second; after each, the healthy schedule's tick after then is written."""
    for step in range(PASSES):
        now = start + step * 1000
        runner.run_due(now)
        assert record_of(queue, "healthy").tick_ms == (now // 1000 + 1) * 1000, step


def break_it(kind: str, configure: Callable[..., Queue], monkeypatch: Any) -> Queue:
    if kind == "settings task without backend":
        return configure(SCHEDULES={"healthy": HEALTHY, "broken": TASK_WITHOUT_BACKEND})
    queue = configure(SCHEDULES={"healthy": HEALTHY})
    if kind == "stored task without backend":
        task = Schedule(
            "broken", None, 1000, "UTC", "", task="tests.task_app.tasks.add", source="api"
        )
        define_broken(queue, task.to_json(), task.fingerprint)
    elif kind == "unreadable definition":
        define_broken(queue, '{"every_ms": "soon"}')
    else:  # any exception building one schedule's tick
        payload = Schedule("broken", None, 1000, "UTC", '"x"', source="api")
        define_broken(queue, payload.to_json(), payload.fingerprint)
        tick_payload = runner_module.tick_payload

        def failing(schedule: Schedule, *args: Any) -> str:
            if schedule.name == "broken":
                raise RuntimeError("no payload today")
            return tick_payload(schedule, *args)

        monkeypatch.setattr(runner_module, "tick_payload", failing)
    return queue


REASONS = {
    "settings task without backend": "no DelayQueueBackend in TASKS carries queue 'default'",
    "stored task without backend": "no DelayQueueBackend in TASKS carries queue 'default'",
    "unreadable definition": "unreadable definition",
    "error building tick": "RuntimeError: no payload today",
}


@pytest.mark.parametrize("kind", list(REASONS))
def test_a_failing_schedule_is_passed_over_while_the_others_fire_on_time(
    kind: str,
    configure: Callable[..., Queue],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = break_it(kind, configure, monkeypatch)
    runner = ScheduleRunner(queue)
    with caplog.at_level(logging.ERROR, logger="delayqueue_django.schedules"):
        run_passes(queue, runner, first_pass_ms(queue))

    # Logged once (tried again at 5 s, then 15 s, ... not at every pass), naming it.
    [logged] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged.startswith("schedule broken of queue default fails (tried 1 time(s)")
    assert REASONS[kind] in logged
    # Recorded where an operator looks (an unreadable definition is no ScheduleInfo).
    failure = record_of(queue, "broken").failure
    assert failure is not None
    assert REASONS[kind] in failure.reason
    shown = {info.name: info for info in queue.schedules.all()}
    assert shown["healthy"].failure is None
    if kind != "unreadable definition":
        assert REASONS[kind] in (shown["broken"].failure or "")
        assert shown["broken"].failing_since is not None
    assert not [m for m in queue.list_messages("pending") if m.id.startswith("tick:broken:")]


def test_a_schedule_name_from_outside_is_logged_on_one_line(
    configure: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = configure()
    # A name the API refuses, and a line after it that would pass for a record of its own.
    name = "broken\n2024-05-06 12:00:00,000 INFO delayqueue_django.schedules: all is well"
    queue.store.define_schedule(
        name, '{"every_ms": "soon"}', "0badf00d", expect="any", start_ms=0, first=None
    )
    with caplog.at_level(logging.ERROR, logger="delayqueue_django.schedules"):
        ScheduleRunner(queue).run_due(first_pass_ms(queue))
    [logged] = [r.getMessage() for r in caplog.records if r.name == "delayqueue_django.schedules"]
    assert logged.startswith(
        "schedule broken\\n2024-05-06 12:00:00,000 INFO delayqueue_django.schedules: all is "
        "well of queue default fails (tried 1 time(s)"
    )
    assert "\n" not in logged


def test_a_failing_schedule_is_tried_again_with_a_backoff_and_fires_once_fixed(
    configure: Callable[..., Queue],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = configure(SCHEDULES={"healthy": HEALTHY, "broken": TASK_WITHOUT_BACKEND})
    runner = ScheduleRunner(queue)
    start = first_pass_ms(queue)
    clock, tries = [start], []
    tick_payload = runner_module.tick_payload

    def counted(schedule: Schedule, *args: Any) -> str:
        if schedule.name == "broken":
            tries.append(clock[0])
        return tick_payload(schedule, *args)

    monkeypatch.setattr(runner_module, "tick_payload", counted)
    next_call = runner.run_due(start)  # the sync's try fails
    # Called back for the healthy one's next tick, not at once for the broken one.
    assert next_call == (start // 1000 + 1) * 1000
    for now in range(start + 1000, start + 40_000, 1000):
        clock[0] = now
        runner.run_due(now)
    # Tried again 5 s after the sync's try (on the store's clock, a little before the
    # first pass's), then after 10 and 20 s: not at every pass.
    assert len(tries) == 4
    assert 3000 <= tries[1] - start <= 5000
    assert [later - earlier for earlier, later in itertools.pairwise(tries[1:])] == [10_000, 20_000]

    settings.TASKS = {
        "default": {"BACKEND": "delayqueue_django.tasks.DelayQueueBackend", "QUEUES": ["default"]}
    }
    with caplog.at_level(logging.INFO, logger="delayqueue_django.schedules"):
        runner.run_due(start + 80_000)  # past the next try, 40 s after the last
    assert "schedule broken of queue default fires again" in caplog.text
    assert record_of(queue, "broken").tick_ms > 0
    assert record_of(queue, "broken").failure is None  # cleared by the tick written
    assert queue.schedules.get("broken").failure is None


# Stored definitions no version of this package reads, as a foreign client writes them.
UNREADABLE_DEFINITIONS = {
    "bytes not utf8": b"\xff\xfe{garbage",
    "json of another shape": b"[1, 2]",
    "nested past the parser": b"[" * 100_000,
    "arguments that are no list": json.dumps(
        {**Schedule("x", None, 60_000, "UTC", "", task="t.t", source="api").as_dict(), "args": 5}
    ).encode(),
}


@pytest.mark.parametrize("added_first", [True, False], ids=["overwritten", "written alone"])
@pytest.mark.parametrize("kind", list(UNREADABLE_DEFINITIONS))
def test_a_definition_that_cannot_be_read_is_listed_as_unreadable_and_can_be_removed(
    redis_queue: Queue, raw: redis.Redis | redis.RedisCluster, kind: str, added_first: bool
) -> None:
    queue = redis_queue
    queue.schedules.add("healthy", every=60, payload=1)
    waiting = None
    if added_first:  # with its record of ticks, and a tick waiting
        waiting = queue.schedules.add("broken", every=60, payload=2).next_id
        assert waiting is not None
    raw.hset(queue.store.keys.key("schedules"), "broken", UNREADABLE_DEFINITIONS[kind])

    shown = {info.name: info for info in queue.schedules.all()}
    assert sorted(shown) == ["broken", "healthy"]
    broken = shown["broken"]
    assert (broken.schedule, broken.source) == (None, None)
    assert (broken.unreadable or "").startswith("schedule 'broken' has an unreadable definition: ")
    assert (broken.paused, broken.next_id, broken.last_run) == (False, waiting, None)
    assert (broken.next_run is None) == (waiting is None)
    assert shown["healthy"].unreadable is None
    assert queue.schedules.get("broken") == broken
    # Nothing can be made of it but its removal.
    for act in (queue.schedules.pause, queue.schedules.resume, queue.schedules.change):
        with pytest.raises(InvalidSchedule, match=r"unreadable definition.*remove"):
            act("broken")

    assert queue.schedules.remove("broken")
    assert [info.name for info in queue.schedules.all()] == ["healthy"]
    for key in queue.store.keys.schedule_keys:
        assert not raw.hexists(key, "broken")
    assert [m.id for m in queue.list_messages("pending")] == [shown["healthy"].next_id]


@pytest.mark.parametrize("kind", list(UNREADABLE_DEFINITIONS))
def test_a_definition_that_cannot_be_read_stops_no_worker(
    redis_configure: Callable[..., Queue],
    raw: redis.Redis | redis.RedisCluster,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    queue = redis_configure(SCHEDULES={"healthy": HEALTHY})
    raw.hset(queue.store.keys.key("schedules"), "broken", UNREADABLE_DEFINITIONS[kind])
    with caplog.at_level(logging.ERROR, logger="delayqueue_django.schedules"):
        run_passes(queue, ScheduleRunner(queue), first_pass_ms(queue))
    assert "schedule broken of queue default fails" in caplog.text
    assert queue.schedules.get("broken").unreadable is not None


def test_a_cursor_past_2_53_reads_as_damage_to_lua_and_python_and_is_replaced(
    redis_configure: Callable[..., Queue],
    raw: redis.Redis | redis.RedisCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = redis_configure(SCHEDULES={"healthy": HEALTHY, "damaged": HEALTHY})
    start = first_pass_ms(queue)
    ScheduleRunner(queue).run_due(start)
    before = record_of(queue, "damaged")
    assert before.fingerprint is not None
    huge = "9" * 25
    raw.hset(
        queue.store.keys.key("schedule_ticks"),
        "damaged",
        f"{before.fingerprint}:0:{huge}:{before.tick_ms}:{before.previous_ms}",
    )

    # Python and Lua read it alike: as no record (Lua took the cursor for 1e25 and
    # answered "behind" to every tick, so the schedule fired nothing, silently).
    assert record_of(queue, "damaged").fingerprint is None
    reply = queue.store.write_tick("damaged", before.fingerprint, Tick(start + 1500, 0, '"ok"'))
    assert reply.status == "missing"

    # A worker reporting the damage defines the schedule again; both go on firing.
    runner = ScheduleRunner(queue)
    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        for step in range(1, 6):
            now = start + step * 1000
            runner.run_due(now)
            for name in ("healthy", "damaged"):
                assert record_of(queue, name).tick_ms == (now // 1000 + 1) * 1000, (name, step)
    damage = [r for r in caplog.records if "damaged tick record" in r.getMessage()]
    assert len(damage) == 1
    assert "field damaged is unreadable" in caplog.text  # schedule.lua's own warning
