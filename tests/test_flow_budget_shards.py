"""A sharded queue's rate limit and cap hold for the whole queue (issue #27, engine.flow):
all of either is usable from one shard, never more over all shards, a reshard cannot
double them, and a rate set at run time binds a process that had not heard of it."""

import time
from collections.abc import Callable

import pytest

from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.flow import Reservation
from delayqueue_django.engine.sharding.placement import key_shard
from delayqueue_django.engine.sharding.store import parts
from tests.flow_gates.scenario import busiest_window

pytestmark = pytest.mark.parametrize("backend_url", ["standalone", "memory"], indirect=True)


def send_to_one_shard(queue: Queue, count: int, layout: int, shard: int = 2) -> None:
    """``count`` messages, every one on shard ``shard`` of ``layout`` (by their keys)."""
    keys = (f"k{n}" for n in range(10_000))
    for key in [key for key in keys if key_shard(key, layout) == shard][:count]:
        queue.send({"key": key}, key=key)


def drain(queues: list[Queue], count: int, seconds: float) -> list[int]:
    """Fetch and ack (the queues in turn) until ``count`` were handed out or ``seconds``
    passed; the store's time of each hand-out (its lease's start: see engine.flow)."""
    handed: list[int] = []
    deadline = time.monotonic() + seconds
    turn = 0
    while len(handed) < count and time.monotonic() < deadline:
        queue = queues[turn % len(queues)]
        fetched = queue.fetch(100)
        turn += 1
        consume_ms = queue.config.max_consume_ms
        handed += [message.deadline_ms - consume_ms for message in fetched.messages]
        queues[0].ack(fetched.messages)
        time.sleep(0.02)
    return handed


def test_one_busy_shard_gets_the_whole_rate(configure: Callable[..., Queue]) -> None:
    queue = configure(SHARDS=4, RATE_LIMIT="10/s")
    send_to_one_shard(queue, 30, 4)
    started = time.monotonic()
    handed = drain([queue], 30, seconds=8)
    took = time.monotonic() - started
    assert len(handed) == 30
    assert busiest_window(handed, 1000) <= 10
    # 30 at 10 a second: two windows and a bit (a share of 10 // 4 would take 10 s).
    assert 1.9 <= took <= 4.0


def test_one_busy_shard_gets_the_whole_cap(configure: Callable[..., Queue]) -> None:
    queue = configure(SHARDS=4, MAX_IN_FLIGHT=5)
    send_to_one_shard(queue, 12, 4)
    held: list[Message] = []
    for _ in range(4):
        held += queue.fetch(100).messages
    assert len(held) == 5
    assert queue.stats()["unack"] == 5
    queue.ack(held[:2])
    more: list[Message] = []
    for _ in range(4):
        more += queue.fetch(100).messages
    assert len(more) == 2
    queue.nack(more[:1], delay=60)
    queue.release(more[1:])
    again: list[Message] = []
    for _ in range(4):
        again += queue.fetch(100).messages
    assert len(again) == 2
    assert queue.stats()["unack"] == 5


def test_a_reshard_cannot_double_the_rate(configure: Callable[..., Queue]) -> None:
    before = configure(SHARDS=2, RATE_LIMIT="10/s")
    before.send_many([{"n": n} for n in range(25)])
    after = configure(SHARDS=3, RATE_LIMIT="10/s")
    after.send_many([{"n": n} for n in range(25)])
    # Workers of both layouts drain side by side, the new ones the old layout's shards too.
    handed = drain([after, before], 50, seconds=10)
    assert len(handed) == 50
    assert busiest_window(handed, 1000) <= 10


def test_a_run_time_rate_binds_a_process_that_had_not_heard_of_it(
    configure: Callable[..., Queue],
) -> None:
    admin = configure(SHARDS=4)
    admin.set_rate_limit("5/s")
    worker = configure(SHARDS=4, MAX_CONSUME_DURATION=60)
    assert worker is not admin
    worker.send_many([{"n": n} for n in range(30)])
    handed = drain([worker], 30, seconds=1.5)
    assert 5 <= len(handed) <= 10
    assert busiest_window(handed, 1000) <= 5
    admin.set_rate_limit(None)
    assert len(drain([worker], 30 - len(handed), seconds=2)) == 30 - len(handed)


def test_an_idle_sharded_worker_reserves_nothing(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = configure(SHARDS=4, RATE_LIMIT="10/s")
    base = parts(queue.store)["0"]
    reserved: list[int] = []
    reserve = base.reserve

    def counted(count: int, name: str) -> Reservation:
        reserved.append(count)
        return reserve(count, name)

    subscription = queue.store.subscribe_wakeups()
    try:
        for _ in range(3):
            queue.fetch(100)
        monkeypatch.setattr(base, "reserve", counted)
        # Listened to, with no shard due: looks (each at most IDLE_LOOK_SHARDS shards),
        # no reservation.
        for _ in range(5):
            assert queue.fetch(100).messages == []
        assert reserved == []
        queue.send({"n": 1})
        assert subscription.wait(timeout=2.0) is not None
        assert len(queue.fetch(100).messages) == 1
        assert reserved == [100]
    finally:
        subscription.close()


def test_a_rate_below_one_per_shard_can_be_set_and_binds(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(SHARDS=4, MAX_CONSUME_DURATION=60)
    queue.set_rate_limit("2/s")
    assert queue.flow().rate_limit == "2/s"
    send_to_one_shard(queue, 6, 4, shard=3)
    got: list[Message] = []
    for _ in range(4):
        got += queue.fetch(10).messages
    assert len(got) == 2


@pytest.mark.parametrize("shards", [1, 4])
def test_deleting_an_in_flight_message_frees_its_slot(
    configure: Callable[..., Queue], shards: int
) -> None:
    queue = configure(SHARDS=shards, MAX_IN_FLIGHT=2, MAX_CONSUME_DURATION=60)
    queue.send_many([{"n": n} for n in range(6)])
    held: list[Message] = []
    for _ in range(4):
        held += queue.fetch(10).messages
    assert len(held) == 2
    assert queue.delete(held[0].id) == "unack"
    more: list[Message] = []
    for _ in range(4):
        more += queue.fetch(10).messages
    assert len(more) == 1
