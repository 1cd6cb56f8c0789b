"""The metrics history (Queue.metrics, see "Metrics history" in _prelude.lua): what it
counts adds up to what the queue handled, on every backend (a sharded queue's shards added
up); minutes are rolled up into hours after a day and go after 14 days; counts written by
the release before (throughput's "<minute>:acked" and "<minute>:failed") still read."""

import asyncio
import itertools
import struct
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Metrics, Queue
from delayqueue_django.engine.memory import ManualClock, MemoryServer, add_server, remove_server
from delayqueue_django.engine.sharding.store import parts
from tests.helpers import fetch_when_due, redis_store, store_time_ms, wait_for

RECORD = struct.Struct(">7Iq")
HOUR_MS = 3_600_000


def totals(points: list[Metrics]) -> dict[str, int]:
    names = ("sent", "acked", "nacked", "dead", "expired", "handed")
    return {name: sum(getattr(point, name) for point in points) for name in names}


def test_the_history_adds_up_to_what_the_queue_handled(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05, RETRY_COUNT=5)
    queue.send_many(range(8))
    queue.send("alone")
    queue.send("expires", expires=0.02)
    queue.send("times out")
    time.sleep(0.03)
    fetched = {m.payload: m for m in wait_for(lambda: queue.fetch(20).messages, what="work")}
    assert set(fetched) == {*range(8), "alone", "times out"}  # "expires" expired unseen
    queue.ack([fetched[i] for i in range(4)])
    queue.ack([fetched[0]])  # a stale duplicate counts nothing
    queue.nack([fetched[4], fetched[5]], delay=60)
    queue.bury([fetched[6], fetched[7]])
    queue.ack([fetched["alone"]])
    time.sleep(0.06)
    queue.fetch(0)  # "times out" timed out: refused, back to be retried

    points = queue.metrics(since=timedelta(minutes=5))
    assert totals(points) == {
        "sent": 11,
        "acked": 5,
        "nacked": 3,
        "dead": 2,
        "expired": 1,
        "handed": 10,
    }
    assert len(points) == 5
    assert all(point.start.tzinfo is UTC and point.start.second == 0 for point in points)
    assert [b.start - a.start for a, b in itertools.pairwise(points)] == [timedelta(minutes=1)] * 4
    handed = [point for point in points if point.handed]
    assert all(point.lag_max_ms is not None and point.lag_max_ms >= 20 for point in handed)
    assert all(point.lag_avg_ms is not None for point in handed)
    assert all(p.lag_avg_ms is None and p.lag_max_ms is None for p in points if not p.handed)
    # throughput() reads the same history: failed adds up nacked, dead and expired.
    rows = queue.throughput(5)
    assert sum(row[1] for row in rows) == 5
    assert sum(row[2] for row in rows) == 6


def test_coarser_steps_add_their_minutes_up(configure: Callable[..., Queue]) -> None:
    queue = configure()
    queue.send_many(range(3))
    queue.ack(fetch_when_due(queue, 3))
    [hour] = queue.metrics(since=timedelta(minutes=1), step=timedelta(hours=1))
    assert (hour.sent, hour.acked, hour.handed) == (3, 3, 3)
    assert hour.start.minute == 0
    now = datetime.fromtimestamp(store_time_ms(queue) / 1000, tz=UTC)
    days = queue.metrics(since=now - timedelta(days=2), step=timedelta(days=1))
    assert len(days) == 3
    assert totals(days)["acked"] == 3
    assert queue.metrics(since=timedelta(0))[-1].start <= now


@pytest.mark.parametrize(
    ("since", "step", "problem"),
    [
        (timedelta(hours=1), timedelta(seconds=90), "step must be a whole number of minutes"),
        (timedelta(hours=1), timedelta(0), "step must be a whole number of minutes"),
        (datetime(2026, 1, 1), timedelta(minutes=1), "since must be an aware datetime"),
        (timedelta(minutes=-1), timedelta(minutes=1), "since must not be negative"),
    ],
)
def test_bad_arguments_are_refused(
    queue: Queue, since: datetime | timedelta, step: timedelta, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        queue.metrics(since=since, step=step)


@pytest.fixture
def clock(settings: Any) -> Iterator[ManualClock]:
    """The default queue on a memory server of its own, whose clock stands still."""
    clock = ManualClock(start_ms=1_700_000_000_000)
    add_server(MemoryServer("history", clock))
    settings.DELAYQUEUES = {"default": {"URL": "memory://history"}}
    yield clock
    remove_server("history")


def test_minutes_roll_up_into_hours_after_a_day_and_go_after_14_days(clock: ManualClock) -> None:
    queue = get_queue()
    queue.send_many(range(3))
    clock.advance(2)
    queue.ack(queue.fetch(3).messages)
    start = datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert queue.prune_throughput() == 0
    clock.advance(timedelta(hours=25))
    assert queue.prune_throughput() == 1
    assert queue.prune_throughput() == 0
    # Per hour now: a minute step finds the hour's counts at its first minute.
    hour_start = start.replace(minute=0, second=0)
    points = queue.metrics(since=hour_start)
    [(hour, counts)] = [(p.start, p) for p in points if p.sent]
    assert hour == hour_start
    assert (counts.sent, counts.acked, counts.handed) == (3, 3, 3)
    assert (counts.lag_max_ms, counts.lag_avg_ms) == (2000, 2000.0)
    clock.advance(timedelta(days=13))
    assert totals(queue.metrics(since=timedelta(days=14), step=timedelta(days=1)))["sent"] == 3
    clock.advance(timedelta(days=2))
    queue.prune_throughput()
    assert totals(queue.metrics(since=timedelta(days=15), step=timedelta(hours=1)))["sent"] == 0


def test_a_sharded_queue_adds_its_shards_up(settings: Any) -> None:
    clock = ManualClock(start_ms=1_700_000_000_000)
    add_server(MemoryServer("history-shards", clock))
    try:
        settings.DELAYQUEUES = {"default": {"URL": "memory://history-shards", "SHARDS": 4}}
        queue = get_queue()
        queue.send_many(range(40))
        assert len(parts(queue.store)) == 4
        queue.ack(queue.fetch(40).messages)
        [point] = queue.metrics(since=timedelta(minutes=1))
        assert (point.sent, point.acked, point.handed) == (40, 40, 40)
    finally:
        remove_server("history-shards")


def put_minute_records(
    raw: Any, queue: Queue, hour: int, records: dict[int, tuple[int, ...]]
) -> str:
    """Minute records written by hand into an hour's key (Redis's clock cannot be moved)."""
    key = queue.store.keys.key(f"metrics:m:{hour}")
    for minute, record in records.items():
        raw.setrange(key, minute * RECORD.size, RECORD.pack(*record))
    return key


def test_redis_rolls_an_hour_older_than_a_day_up_in_one_step(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    hour = store_time_ms(queue) // HOUR_MS - 30
    key = put_minute_records(
        raw, queue, hour, {0: (5, 4, 1, 1, 0, 4, 700, 1000), 59: (1, 2, 0, 0, 1, 2, 900, 300)}
    )
    since = datetime.fromtimestamp(hour * 3600, tz=UTC)
    before = queue.metrics(since=since, step=timedelta(hours=1))[0]
    assert queue.prune_throughput() == 1
    assert raw.exists(key) == 0
    day_key = queue.store.keys.key(f"metrics:h:{hour // 24}")
    assert 0 < raw.pttl(day_key) <= 15 * 86_400_000
    after = queue.metrics(since=since, step=timedelta(hours=1))[0]
    assert before == after
    assert (after.sent, after.acked, after.nacked, after.dead, after.expired) == (6, 6, 1, 1, 1)
    assert (after.handed, after.lag_max_ms, after.lag_avg_ms) == (6, 900, 1300 / 6)


def test_the_last_day_stays_per_minute(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    queue.send("now")
    assert queue.prune_throughput() == 0
    hour = store_time_ms(queue) // HOUR_MS
    # The minute key of the hour now, and of the hour before, are given their end.
    assert raw.pttl(queue.store.keys.key(f"metrics:m:{hour}")) > 14 * 86_400_000
    assert totals(queue.metrics())["sent"] == 1


def test_counts_of_the_release_before_still_read(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    key = queue.store.keys.key("throughput")
    minute = store_time_ms(queue) // 60_000
    day_ago = minute - 26 * 60
    raw.hset(
        key,
        mapping={
            f"{minute - 1}:acked": 5,
            f"{minute - 1}:failed": 2,
            f"{minute}:acked": "lots",  # a foreign write reads as 0
            f"{day_ago}:acked": 7,
            "all:acked": 12,
            "junk": 1,
        },
    )
    points = queue.metrics(since=timedelta(minutes=2))
    assert [(p.acked, p.nacked) for p in points] == [(5, 2), (0, 0)]
    assert queue.throughput(2)[0][1:] == (5, 2)
    # Moved into the history by the housekeeping: the same counts, from there; the running
    # totals stay.
    assert queue.prune_throughput() == 5
    assert raw.hkeys(key) == [b"all:acked"]
    assert [(p.acked, p.nacked) for p in queue.metrics(since=timedelta(minutes=2))] == [
        (5, 2),
        (0, 0),
    ]
    since = datetime.fromtimestamp(day_ago * 60, tz=UTC)
    assert queue.metrics(since=since, step=timedelta(hours=1))[0].acked == 7


def test_a_history_key_of_another_type_is_set_aside(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    hour = store_time_ms(queue) // HOUR_MS
    key = queue.store.keys.key(f"metrics:m:{hour}")
    raw.hset(key, "not", "a string")
    queue.send("counted all the same")
    if store_time_ms(queue) // HOUR_MS == hour:
        assert raw.type(key) == b"string"
        assert totals(queue.metrics())["sent"] == 1


def test_keyed_sends_count_what_they_wrote(configure: Callable[..., Queue]) -> None:
    queue = configure()
    queue.send("first", key="order-1", delay=60)
    queue.send("kept", key="order-1", delay=60)  # the key's message kept: nothing written
    queue.send("replaces", key="order-1", delay=60, if_exists="replace")
    queue.send("other", key="order-2", delay=60)
    assert totals(queue.metrics(since=timedelta(minutes=2)))["sent"] == 3


def test_postpones_are_refusals_and_one_too_many_is_dead(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_POSTPONES=1)
    queue.send("later")
    [message] = fetch_when_due(queue)
    queue.postpone([message], delay=0)
    [again] = fetch_when_due(queue)
    queue.postpone([again], delay=0)  # the second postpone is one too many
    counts = totals(queue.metrics(since=timedelta(minutes=2)))
    assert (counts["nacked"], counts["dead"], counts["handed"]) == (1, 1, 2)
    assert queue.stats()["garbage"] == 1


def commands_of(client: Any, call: Callable[[], object]) -> dict[str, int]:
    """The Redis commands ``call`` made (the script calls themselves left out), as INFO
    commandstats counts them."""
    client.config_resetstat()
    call()
    stats = client.info("commandstats")
    left_out = ("fcall", "fcall_ro", "evalsha", "info", "config|resetstat")
    return {
        name.removeprefix("cmdstat_"): int(stat["calls"])
        for name, stat in stats.items()
        if name.removeprefix("cmdstat_") not in left_out
    }


def test_a_plain_ack_costs_redis_the_commands_it_did_before_the_history() -> None:
    # The release before counted an ack's minute with a HINCRBY of "<minute>:acked"; the
    # history's BITFIELD takes its place: 8 commands, as before.
    queue = get_queue()
    client = redis_store(queue).client
    queue.send_many(["warm", "plain"])
    warm, plain = fetch_when_due(queue, 2)
    queue.ack([warm])
    assert commands_of(client, lambda: queue.ack([plain])) == {
        "time": 1,
        "hmget": 1,
        "zmscore": 1,
        "zrem": 1,
        "hdel": 2,
        "hincrby": 1,  # the running total, all:acked
        "bitfield": 1,  # the minute's record
    }
    # A send call counts its messages with one BITFIELD, however many it sends.
    one = commands_of(client, lambda: queue.send("one", delay=60))
    many = commands_of(client, lambda: queue.send_many(range(50), delay=60))
    assert one["bitfield"] == many["bitfield"] == 1


def test_ametrics_reads_the_same_history(configure: Callable[..., Queue]) -> None:
    queue = configure()

    async def send_and_read() -> list[Metrics]:
        await queue.asend("from async code")
        return await queue.ametrics(since=timedelta(minutes=2))

    assert totals(asyncio.run(send_and_read()))["sent"] == 1
