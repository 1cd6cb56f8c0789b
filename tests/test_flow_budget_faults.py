"""A sharded queue's budget (issue #27, engine.flow) through the awkward cases: a shard's
reply lost after its script ran, a request repeated after it succeeded, a hold of the
gates that lasts, and a fetch the gates bound, which wakes no idle peer."""

import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import FetchResult
from delayqueue_django.engine.sharding.store import ShardedStore, parts
from tests.flow_gates.scenario import busiest_window
from tests.test_flow_budget_shards import send_to_one_shard

pytestmark = pytest.mark.parametrize("backend_url", ["standalone", "memory"], indirect=True)


def lose_first_reply(queue: Queue, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shard ``name``'s first fetch that hands something out runs, but its reply is lost."""
    shard = parts(queue.store)[name]
    original = shard.fetch
    lost: list[bool] = []

    def lossy(*args: Any, **kwargs: Any) -> FetchResult:
        result = original(*args, **kwargs)
        if not lost and result.deliveries:
            lost.append(True)
            raise RedisConnectionError("reply lost after the script ran")
        return result

    monkeypatch.setattr(shard, "fetch", lossy)


def start_at(queue: Queue, name: str, *, retry_due: bool = False) -> None:
    """The next fetch asks shard ``name`` first (and, if told, its retry has come)."""
    store = queue.store
    assert isinstance(store, ShardedStore)
    if retry_due:
        store._plans[name].retry_at = -math.inf
    store._cursor = store._order.index(name)


def fetched(queue: Queue, request: str) -> list[Message]:
    return queue.fetch(5, fetcher="f", request=request).messages


def test_a_lost_shard_reply_cannot_overshoot_the_cap(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = configure(SHARDS=4, MAX_IN_FLIGHT=5, MAX_CONSUME_DURATION=60)
    send_to_one_shard(queue, 5, 4, shard=2)
    lose_first_reply(queue, "4.2", monkeypatch)
    start_at(queue, "4.2")
    assert fetched(queue, "1") == []  # 4.2 handed 5 out; its reply was lost
    send_to_one_shard(queue, 4, 4, shard=1)
    start_at(queue, "4.1")
    second = fetched(queue, "2")
    start_at(queue, "4.2", retry_due=True)
    third = fetched(queue, "3")  # 4.2 hands out again what it recorded
    assert len(second) + len(third) <= 5
    assert queue.stats()["unack"] <= 5


def test_a_lost_shard_reply_cannot_overshoot_the_rate(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = configure(SHARDS=4, RATE_LIMIT="5/s", MAX_CONSUME_DURATION=60)
    send_to_one_shard(queue, 5, 4, shard=2)
    lose_first_reply(queue, "4.2", monkeypatch)
    start_at(queue, "4.2")
    assert fetched(queue, "1") == []
    send_to_one_shard(queue, 4, 4, shard=1)
    start_at(queue, "4.1")
    second = fetched(queue, "2")
    start_at(queue, "4.2", retry_due=True)
    third = fetched(queue, "3")
    consume_ms = queue.config.max_consume_ms
    assert busiest_window([m.deadline_ms - consume_ms for m in second + third], 1000) <= 5


def test_a_replay_beyond_the_grant_counts_against_the_rate(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = configure(SHARDS=4, RATE_LIMIT="6/s", MAX_CONSUME_DURATION=60)
    send_to_one_shard(queue, 5, 4, shard=2)
    lose_first_reply(queue, "4.2", monkeypatch)
    start_at(queue, "4.2")
    assert fetched(queue, "1") == []  # 5 of the 6 held: 4.2 may have handed them out
    time.sleep(1.1)  # they leave the window
    start_at(queue, "4.2", retry_due=True)
    second = queue.fetch(1, fetcher="f", request="2").messages
    assert len(second) == 5  # a grant of 1; the 5 go out again
    send_to_one_shard(queue, 4, 4, shard=1)
    start_at(queue, "4.1")
    third = fetched(queue, "3")
    assert len(third) == 1  # the window had room for one more
    consume_ms = queue.config.max_consume_ms
    assert busiest_window([m.deadline_ms - consume_ms for m in second + third], 1000) <= 6


def test_repeating_a_request_that_succeeded_takes_nothing_new(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(SHARDS=4, MAX_IN_FLIGHT=3, MAX_CONSUME_DURATION=60)
    send_to_one_shard(queue, 3, 4, shard=1)
    start_at(queue, "4.2")
    first = fetched(queue, "1")
    assert len(first) == 3
    send_to_one_shard(queue, 5, 4, shard=2)
    again = fetched(queue, "1")  # its reply lost on the way to the caller
    assert {m.id for m in again} == {m.id for m in first}
    assert queue.stats()["unack"] == 3


def test_a_paused_sharded_queue_keeps_its_shards_housekeeping(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(SHARDS=4, MAX_IN_FLIGHT=5)
    queue.send_many([{"n": n} for n in range(8)], expires=0.3)
    queue.pause()
    time.sleep(0.5)
    # Each fetch the gates hold back asks one shard, in turn, for nothing.
    for _ in range(4):
        assert queue.fetch(100).messages == []
    assert queue.stats()["expired_total"] == 8


@pytest.mark.parametrize("shards", [1, 4])
def test_a_fetch_the_gates_bound_wakes_no_peer(
    configure: Callable[..., Queue], shards: int
) -> None:
    queue = configure(SHARDS=shards, RATE_LIMIT="5/s")
    if shards == 1:
        queue.send_many([{"n": n} for n in range(20)])
        shard = parts(queue.store)["0"]
    else:
        send_to_one_shard(queue, 20, 4, shard=2)
        shard = parts(queue.store)["4.2"]
    subscription = shard.subscribe_channels([shard.keys.wakeup_channel])

    def drain() -> None:
        while subscription.wait(timeout=0.1) is not None:
            pass

    try:
        drain()  # the sends' wake-ups
        assert len(queue.fetch(10).messages) == 5
        assert subscription.wait(timeout=0.3) is None
        # Not bound by the gates, a full batch still wakes peers: work is waiting.
        queue.set_rate_limit("50/s")
        drain()  # the new rate's
        assert len(queue.fetch(5).messages) == 5
        assert subscription.wait(timeout=1.0) is not None
    finally:
        subscription.close()
