"""The store's schedule operations (schedule.lua, schedules.lua), on every backend: each tick
time is written once, whoever writes it; definitions, pauses and removals move the waiting
tick with them."""

import threading
from typing import Any

import pytest
import redis

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import Store
from delayqueue_django.engine.records import ScheduleFailure, Tick, parse_tick_id, tick_id
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.definition import Schedule
from tests.helpers import fetch_when_due, states_of, store_time_ms

FP, OTHER_FP = "aa11", "bb22"


def tick(at_ms: int, payload: str = '{"report": "nightly"}', budget: int = 2) -> Tick:
    return Tick(at_ms, budget, payload)


def define(store: Store, name: str = "nightly", fingerprint: str = FP, **options: Any) -> Any:
    defaults: dict[str, Any] = {"expect": "any", "start_ms": 0, "first": None}
    return store.define_schedule(name, '{"every_ms": 1000}', fingerprint, **(defaults | options))


def pending_ids(queue: Queue) -> list[str]:
    return [entry.id for entry in queue.list_messages("pending", limit=1000)]


def test_tick_ids_name_the_schedule_and_the_time() -> None:
    assert tick_id("nightly", 1700000000000) == "tick:nightly:1700000000000"
    assert parse_tick_id("tick:a:b:17") == ("a:b", 17)
    assert parse_tick_id("tick::17") is None
    assert parse_tick_id("tick:a:x") is None
    assert parse_tick_id("Xk2a9-not-a-tick") is None


def test_a_tick_is_an_ordinary_message_due_at_its_time(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    define(store, start_ms=now - 1000)
    reply = store.write_tick("nightly", FP, tick(now + 200, budget=5))
    assert (reply.status, reply.cursor_ms, reply.tick_ms) == ("written", now + 200, now + 200)

    [message] = fetch_when_due(queue)
    assert message.id == f"tick:nightly:{now + 200}"
    assert message.payload == {"report": "nightly"}
    assert message.due_ms == now + 200
    assert (message.attempt, message.retry_count) == (1, 5)


def test_each_tick_time_is_written_once(queue: Queue) -> None:
    store = queue.store
    define(store, start_ms=1000)
    assert store.write_tick("nightly", FP, tick(5000)).status == "written"
    again = store.write_tick("nightly", FP, tick(5000))
    assert (again.status, again.cursor_ms) == ("behind", 5000)
    assert store.write_tick("nightly", FP, tick(4000)).status == "behind"
    later = store.write_tick("nightly", FP, tick(6000))
    assert (later.status, later.tick_ms, later.previous_ms) == ("written", 6000, 5000)
    assert pending_ids(queue) == ["tick:nightly:5000", "tick:nightly:6000"]


def test_racing_writers_write_every_tick_exactly_once(queue: Queue) -> None:
    store = queue.store
    define(store, start_ms=0)
    written: list[int] = []
    lock = threading.Lock()

    def writer() -> None:
        for at in range(1000, 1040):
            if store.write_tick("nightly", FP, tick(at)).status == "written":
                with lock:
                    written.append(at)

    threads = [threading.Thread(target=writer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(written) == list(range(1000, 1040))
    assert len(pending_ids(queue)) == 40


def test_a_tick_of_another_definition_a_paused_or_missing_schedule_is_refused(
    queue: Queue,
) -> None:
    store = queue.store
    assert store.write_tick("nightly", FP, tick(5000)).status == "missing"
    define(store, start_ms=1000)
    assert store.write_tick("nightly", OTHER_FP, tick(5000)).status == "stale"
    store.pause_schedule("nightly", 1000)
    assert store.write_tick("nightly", FP, tick(5000)).status == "paused"
    assert pending_ids(queue) == []


def test_defining_writes_the_first_tick_and_an_unchanged_definition_keeps_its_ticks(
    queue: Queue,
) -> None:
    store = queue.store
    first = define(store, start_ms=1000, first=tick(2000), expect="new")
    assert (first.status, first.cursor_ms, first.tick_ms) == ("defined", 2000, 2000)
    assert define(store, expect="new").status == "exists"
    assert define(store, "other", expect="existing").status == "missing"
    store.write_tick("nightly", FP, tick(3000))

    same = define(store, start_ms=2500, first=tick(2600))
    assert (same.status, same.cursor_ms, same.tick_ms) == ("unchanged", 3000, 3000)
    assert pending_ids(queue) == ["tick:nightly:2000", "tick:nightly:3000"]


def test_a_changed_definition_replaces_the_waiting_tick(queue: Queue) -> None:
    store = queue.store
    define(store, start_ms=1000, first=tick(9000))
    changed = define(store, fingerprint=OTHER_FP, start_ms=1500, first=tick(8000, '"new"'))
    assert changed.status == "defined"
    assert (changed.cursor_ms, changed.tick_ms) == (8000, 8000)
    assert pending_ids(queue) == ["tick:nightly:8000"]
    assert queue.peek("tick:nightly:8000").payload == '"new"'  # type: ignore[union-attr]
    assert store.write_tick("nightly", FP, tick(10000)).status == "stale"
    assert store.write_tick("nightly", OTHER_FP, tick(10000)).status == "written"


def test_a_tick_already_handed_out_stays_and_is_never_written_again(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    define(store, start_ms=now - 1000, first=tick(now))
    [running] = fetch_when_due(queue)
    # Changed while its tick runs: that tick has fired, and keeps its time.
    changed = define(store, fingerprint=OTHER_FP, start_ms=now - 500, first=tick(now))
    assert (changed.status, changed.cursor_ms, changed.tick_ms) == ("defined", now, 0)
    assert changed.previous_ms == now
    assert states_of(queue, running.id) == ["unack"]
    assert store.write_tick("nightly", OTHER_FP, tick(now)).status == "behind"


def test_a_tick_delivered_early_by_hand_is_not_written_over(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    define(store, start_ms=now, first=tick(now + 60_000))
    assert queue.deliver_now([f"tick:nightly:{now + 60_000}"])
    [early] = fetch_when_due(queue)
    store.remove_schedule("nightly")
    again = define(store, start_ms=now, first=tick(now + 60_000, '"other"'))
    assert (again.status, again.cursor_ms) == ("defined", now + 60_000)
    assert states_of(queue, early.id) == ["unack"]
    assert queue.peek(early.id).payload == '{"report": "nightly"}'  # type: ignore[union-attr]


def test_pausing_removes_the_waiting_tick_and_resuming_writes_the_next(queue: Queue) -> None:
    store = queue.store
    define(store, start_ms=1000, first=tick(2000))
    paused = store.pause_schedule("nightly", 1500)
    assert (paused.status, paused.cursor_ms, paused.tick_ms) == ("paused", 1500, 0)
    assert pending_ids(queue) == []
    [record] = store.read_schedules()[1]
    assert record.paused

    # Resumed with a tick of another definition (it changed since the caller read it):
    # refused, and still paused.
    stale = store.resume_schedule("nightly", OTHER_FP, 5000, tick(6000, '"old"'))
    assert (stale.status, stale.cursor_ms, pending_ids(queue)) == ("stale", 1500, [])
    resumed = store.resume_schedule("nightly", FP, 5000, tick(6000))
    assert (resumed.status, resumed.cursor_ms, resumed.tick_ms) == ("resumed", 6000, 6000)
    # Resuming a running schedule changes nothing: its cursor and tick stay.
    again = store.resume_schedule("nightly", FP, 7000, tick(8000))
    assert (again.status, again.cursor_ms) == ("resumed", 6000)
    assert pending_ids(queue) == ["tick:nightly:6000"]
    assert store.pause_schedule("other", 0).status == "missing"
    assert store.resume_schedule("other", FP, 0, None).status == "missing"


def test_pausing_or_removing_takes_out_the_due_tick_not_handed_out_yet(queue: Queue) -> None:
    # Workers write each tick as the one before falls due, so that one may still wait,
    # behind a backlog: it must not fire once its schedule is paused or removed.
    store = queue.store
    for pause in (True, False):
        define(store, start_ms=1000, first=tick(2000))
        store.write_tick("nightly", FP, tick(3000))
        assert pending_ids(queue) == ["tick:nightly:2000", "tick:nightly:3000"]
        if pause:
            store.pause_schedule("nightly", 2500)
        else:
            store.remove_schedule("nightly")
        assert pending_ids(queue) == []
        store.remove_schedule("nightly")
    # A change leaves it: it fell due under the old definition, which it runs.
    define(store, start_ms=1000, first=tick(2000))
    store.write_tick("nightly", FP, tick(3000))
    define(store, fingerprint=OTHER_FP, start_ms=2500, first=tick(4000))
    assert pending_ids(queue) == ["tick:nightly:2000", "tick:nightly:4000"]


def test_removing_takes_the_waiting_tick_along(queue: Queue) -> None:
    store = queue.store
    define(store, start_ms=1000, first=tick(2000))
    assert store.remove_schedule("nightly", OTHER_FP).status == "stale"
    assert store.remove_schedule("nightly", FP).status == "removed"
    assert store.remove_schedule("nightly").status == "missing"
    assert pending_ids(queue) == []
    assert store.read_schedules()[1] == []
    assert store.write_tick("nightly", FP, tick(3000)).status == "missing"


def test_every_schedule_is_read_with_its_definition_and_ticks(queue: Queue) -> None:
    store = queue.store
    define(store, "b", start_ms=1000, first=tick(2000))
    define(store, "a", start_ms=1000)
    store.write_tick("b", FP, tick(3000))
    now, records = store.read_schedules()
    assert abs(now - store_time_ms(queue)) < 5000
    assert [(r.name, r.fingerprint, r.cursor_ms, r.tick_ms, r.previous_ms) for r in records] == [
        ("a", FP, 1000, 0, 0),
        ("b", FP, 3000, 3000, 2000),
    ]
    assert records[0].definition == '{"every_ms": 1000}'


def test_a_new_or_resumed_schedule_keeps_when_it_started(queue: Queue) -> None:
    # Ticks at or before then, handed out later, were written before: not to be run.
    store = queue.store
    assert store.read_schedule("nightly") is None
    define(store, start_ms=1000, first=tick(2000))
    assert store.read_schedule("nightly") == store.read_schedules()[1][0]
    assert store.read_schedule("nightly").since_ms == 1000  # type: ignore[union-attr]
    define(store, fingerprint=OTHER_FP, start_ms=1500)  # changed: its due ticks still run
    store.pause_schedule("nightly", 2500)
    paused = store.read_schedule("nightly")
    assert (paused.paused, paused.since_ms) == (True, 1000)  # type: ignore[union-attr]
    store.resume_schedule("nightly", OTHER_FP, 3000, None)
    assert store.read_schedule("nightly").since_ms == 3000  # type: ignore[union-attr]
    store.remove_schedule("nightly")
    assert store.read_schedule("nightly") is None
    define(store, start_ms=4000)
    assert store.read_schedule("nightly").since_ms == 4000  # type: ignore[union-attr]
    assert store.read_schedule("other") is None


def test_a_tick_record_written_before_since_was_kept_reads_as_since_0(
    redis_queue: Queue, raw: redis.Redis | redis.RedisCluster
) -> None:
    keys, store = redis_queue.store.keys, redis_queue.store
    raw.hset(keys.key("schedules"), "nightly", '{"every_ms": 1000}')
    raw.hset(keys.key("schedule_ticks"), "nightly", f"{FP}:0:3000:3000:2000")
    record = store.read_schedule("nightly")
    assert record is not None
    assert (record.fingerprint, record.cursor_ms, record.since_ms) == (FP, 3000, 0)
    assert store.write_tick("nightly", FP, tick(4000)).status == "written"
    assert raw.hget(keys.key("schedule_ticks"), "nightly") == f"{FP}:0:4000:4000:3000:0".encode()


def test_schedule_keys_of_the_wrong_type_are_set_aside(
    redis_queue: Queue, raw: redis.Redis | redis.RedisCluster
) -> None:
    keys = redis_queue.store.keys
    raw.set(keys.key("schedule_ticks"), "not a hash")
    raw.set(keys.key("schedules"), "not a hash either")
    assert redis_queue.store.read_schedules()[1] == []
    reply = define(redis_queue.store, start_ms=1000, first=tick(2000))
    assert reply.status == "defined"
    assert len(raw.zrange(keys.key("quarantine"), 0, -1)) == 2
    [record] = redis_queue.store.read_schedules()[1]
    assert (record.fingerprint, record.tick_ms) == (FP, 2000)


def test_an_unreadable_tick_record_starts_the_schedule_afresh(
    redis_queue: Queue, raw: redis.Redis | redis.RedisCluster
) -> None:
    keys = redis_queue.store.keys
    define(redis_queue.store, start_ms=1000)
    raw.hset(keys.key("schedule_ticks"), "nightly", "garbled")
    [record] = redis_queue.store.read_schedules()[1]
    assert record.fingerprint is None
    assert define(redis_queue.store, start_ms=4000, first=tick(5000)).status == "defined"
    assert redis_queue.store.write_tick("nightly", FP, tick(5000)).status == "behind"


def test_the_run_time_api_on_every_backend(queue: Queue) -> None:
    now = store_time_ms(queue)
    info = queue.schedules.add("poll", every=3600, payload={"n": 1})
    first = (now // 3_600_000 + 1) * 3_600_000
    assert info.next_id == f"tick:poll:{first}"
    assert pending_ids(queue) == [f"tick:poll:{first}"]
    assert queue.peek(f"tick:poll:{first}").payload == '{"n":1}'  # type: ignore[union-attr]

    assert queue.schedules.pause("poll").paused
    assert pending_ids(queue) == []
    assert queue.schedules.resume("poll").next_id == f"tick:poll:{first}"
    changed = queue.schedules.change("poll", cron="0 0 1 1 *", time_zone="UTC")
    assert changed.schedule is not None
    assert changed.schedule.cron == "0 0 1 1 *"
    assert changed.schedule.payload == '{"n":1}'  # kept
    assert pending_ids(queue) == [changed.next_id]
    assert queue.schedules.remove("poll")
    assert pending_ids(queue) == []
    assert queue.schedules.all() == []


def test_an_interval_whose_ticks_no_datetime_holds_is_refused(queue: Queue) -> None:
    # Every 31,700 years: the first tick would be in the year 33658.
    with pytest.raises(InvalidSchedule, match=r"every=.*at most 50 years"):
        queue.schedules.add("far", every=1e12, payload=1)
    assert (queue.schedules.all(), pending_ids(queue)) == ([], [])
    # Stored so by another version: listed as unreadable, not a crash of every listing.
    far = Schedule("far", None, 10**15, "UTC", "1", source="api")
    queue.store.define_schedule(
        "far", far.to_json(), far.fingerprint, expect="any", start_ms=0, first=None
    )
    [listed] = queue.schedules.all()
    assert (listed.name, listed.schedule, listed.next_run) == ("far", None, None)
    assert listed.unreadable == (
        "schedule 'far' has an unreadable definition: every_ms 1000000000000000"
    )


def test_a_failure_is_kept_until_a_tick_is_written_or_the_definition_changes(
    queue: Queue,
) -> None:
    store = queue.store
    failure = ScheduleFailure("E049: no backend", 1234)
    assert store.report_schedule_failure("nightly", FP, failure).status == "missing"
    define(store, start_ms=1000)
    assert store.report_schedule_failure("nightly", OTHER_FP, failure).status == "stale"
    assert store.report_schedule_failure("nightly", FP, failure).status == "failed"
    [record] = store.read_schedules()[1]
    assert record.failure == failure
    assert define(store, start_ms=1000).status == "unchanged"
    assert store.read_schedules()[1][0].failure == failure
    store.write_tick("nightly", FP, tick(2000))
    assert store.read_schedules()[1][0].failure is None

    store.report_schedule_failure("nightly", FP, failure)
    define(store, OTHER_FP, start_ms=3000)  # changed: the failure was the old definition's
    assert store.read_schedules()[1][0].failure is None
    store.report_schedule_failure("nightly", OTHER_FP, failure)
    store.remove_schedule("nightly")
    define(store, OTHER_FP, start_ms=3000)
    assert store.read_schedules()[1][0].failure is None


def test_a_schedule_no_worker_declares_is_retired_only_after_the_wait(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    define(store, start_ms=now, first=tick(now + 60_000))
    assert store.declare_schedule("nope").status == "missing"
    assert store.declare_schedule("nightly").status == "declared"
    assert store.retire_schedule("nightly", OTHER_FP, 0).status == "stale"
    # Declared just now: kept for the minute it may go undeclared.
    assert store.retire_schedule("nightly", FP, 60_000).status == "declared"
    assert store.retire_schedule("nightly", FP, 0).status == "removed"
    assert store.read_schedule("nightly") is None
    assert pending_ids(queue) == []  # its waiting tick went with it
    assert store.retire_schedule("nightly", FP, 0).status == "missing"

    # Defined again: its old declaration went with the removal, and a schedule with none
    # counts as declared at the first retire, which starts its wait.
    define(store, start_ms=now)
    assert store.retire_schedule("nightly", "", 0).status == "declared"
    assert store.retire_schedule("nightly", "", 0).status == "removed"
    define(store, start_ms=now)
    store.declare_schedule("nightly")
    assert store.remove_schedule("nightly").status == "removed"
    define(store, start_ms=now)
    assert store.retire_schedule("nightly", FP, 0).status == "declared"
