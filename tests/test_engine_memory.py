"""What only the memory store has: a clock that can be moved, named servers, and its own
sorted set. (Its life cycle is tested with Redis's, by the engine's contract tests.)"""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayqueue_django import get_queue
from delayqueue_django.engine.memory import (
    ManualClock,
    MemoryServer,
    add_server,
    get_server,
    remove_server,
)
from delayqueue_django.engine.memory.scored import ScoredSet


@pytest.fixture
def clock(settings: Any) -> Iterator[ManualClock]:
    """The default queue on a memory server of its own, whose clock stands still."""
    clock = ManualClock(start_ms=1_700_000_000_000)
    add_server(MemoryServer("manual", clock))
    settings.DELAYQUEUES = {"default": {"URL": "memory://manual", "MAX_CONSUME_DURATION": 60}}
    yield clock
    remove_server("manual")


def test_a_message_is_due_when_the_clock_is_moved_past_its_time(clock: ManualClock) -> None:
    queue = get_queue()
    message_id = queue.send("in a month", delay=timedelta(days=30))
    clock.advance(timedelta(days=30) - timedelta(milliseconds=1))
    assert queue.fetch().messages == []
    clock.advance(0.001)
    [message] = queue.fetch().messages
    assert (message.id, message.due_ms) == (message_id, 1_700_000_000_000 + 30 * 86_400_000)


@pytest.mark.parametrize("delay", [0.0004, 0.0025, 2.007, timedelta(microseconds=1500)])
def test_moving_the_clock_by_a_delay_makes_a_message_sent_with_it_due(
    clock: ManualClock, delay: float | timedelta
) -> None:
    # Due times are rounded up to the ms (never early), and so are the clock's moves.
    queue = get_queue()
    message_id = queue.send("soon", delay=delay)
    assert queue.fetch().messages == []
    clock.advance(delay)
    assert [message.id for message in queue.fetch().messages] == [message_id]


def test_the_clock_only_moves_forward(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="a clock only moves forward; cannot advance by -1 s"):
        clock.advance(-1)
    assert clock.now_ms() == 1_700_000_000_000


def test_moving_the_clock_wakes_listening_workers(clock: ManualClock) -> None:
    subscription = get_queue().store.subscribe_wakeups()
    try:
        assert subscription.wait(timeout=0) is None
        clock.advance(5)
        # Due at once, whatever a worker makes of the clock's jump.
        assert subscription.wait(timeout=0) == 0
    finally:
        subscription.close()


def test_deliveries_time_out_on_the_moved_clock(clock: ManualClock) -> None:
    queue = get_queue()
    queue.send("slow")
    [first] = queue.fetch().messages
    clock.advance(60)
    [second] = queue.fetch().messages
    assert (second.id, second.attempt, second.due_ms) == (first.id, 2, first.deadline_ms)


def test_heartbeats_expire_on_the_store_clock(clock: ManualClock) -> None:
    store = get_queue().store
    store.put_heartbeat("w1", '{"pid": 1}', ttl_ms=30_000)
    clock.advance(29.999)
    assert store.heartbeats() == {"w1": '{"pid": 1}'}
    clock.advance(0.001)
    assert store.heartbeats() == {}


def test_task_results_expire_on_the_store_clock(clock: ManualClock) -> None:
    store = get_queue().store
    assert store.write_result("r1", {"status": "READY"}, unless_set={}, ttl_seconds=60) == {
        "status": "READY"
    }
    record = store.write_result(
        "r1", {"status": "RUNNING"}, unless_set={"status": "x", "started_at": "t"}, ttl_seconds=60
    )
    assert record == {"status": "RUNNING", "started_at": "t"}
    clock.advance(59.999)
    assert store.read_result("r1") == record
    clock.advance(0.001)
    assert store.read_result("r1") == {}
    store.write_result("r2", {"status": "READY"}, unless_set={}, ttl_seconds=None)
    clock.advance(timedelta(days=365))
    assert store.read_result("r2") == {"status": "READY"}


def test_queues_on_one_memory_url_share_its_state_across_settings_changes(
    settings: Any,
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "memory://shared"}}
    message_id = get_queue().send("kept", delay=60)
    settings.DELAYQUEUES = {"default": {"URL": "memory://shared", "RETRY_COUNT": 7}}
    assert get_queue().peek(message_id) is not None  # like a Redis server: still there
    settings.DELAYQUEUES = {"default": {"URL": "memory://elsewhere"}}
    assert get_queue().peek(message_id) is None
    assert get_server("shared") is not get_server("elsewhere")


def test_a_memory_server_name_is_taken_once(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="a memory server named 'manual' exists already"):
        add_server(MemoryServer("manual"))


# ScoredSet against the simplest model of a Redis sorted set: a dict, sorted on every read.

operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "pop"]),
        st.sampled_from([f"id{n}" for n in range(12)]),
        st.integers(min_value=0, max_value=20),
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(operations=operations)
def test_the_scored_set_orders_and_ranges_like_a_redis_zset(
    operations: list[tuple[str, str, int]],
) -> None:
    scored, model = ScoredSet(), dict[str, int]()

    def ordered() -> list[tuple[str, int]]:
        return sorted(model.items(), key=lambda item: (item[1], item[0]))

    for operation, member, score in operations:
        if operation == "add":
            scored.add(member, score)
            model[member] = score
        elif operation == "remove":
            assert scored.remove(member) == (model.pop(member, None) is not None)
        else:
            due = [item for item in ordered() if item[1] <= score][:3]
            assert scored.pop_upto(score, 3) == due
            for popped, _ in due:
                del model[popped]
        assert len(scored) == len(model)
        assert list(scored.ordered()) == ordered()
        assert scored.head() == (ordered()[0] if model else None)
        assert scored.upto(score, 4) == [item for item in ordered() if item[1] <= score][:4]
        assert scored.count_upto(score) == sum(1 for value in model.values() if value <= score)
        assert scored.page(2, 3) == ordered()[2:5]
        assert scored.score(member) == model.get(member)


def test_the_scored_set_sweeps_stale_entries_and_stays_correct() -> None:
    scored = ScoredSet()
    for round_ in range(5):
        for n in range(3000):
            scored.add(f"m{n}", (n * 7919 + round_) % 1000)
    assert len(scored._heap) < 2 * 3000 + 1100  # re-scorings did not pile up for ever
    expected = sorted(
        ((f"m{n}", (n * 7919 + 4) % 1000) for n in range(3000)), key=lambda i: (i[1], i[0])
    )
    assert list(scored.ordered()) == expected
