"""The store's relay step (relay.lua, and MemoryStore.relay) on Redis, a Redis Cluster and
the memory store: each relayed message is written once, however often it is relayed."""

import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from tests.helpers import states_of, store_time_ms, wait_for

KEEP_MS = 60_000


def relayed(message_id: str, payload: str = '"p"', at_ms: int = 0, budget: int = 3) -> NewMessage:
    return NewMessage(message_id, payload, budget, at_ms=at_ms)


def test_a_relayed_message_is_written_with_its_due_time(queue: Queue) -> None:
    later = store_time_ms(queue) + 60_000
    dues = queue.store.relay(
        [relayed("past", at_ms=1), relayed("later", at_ms=later, budget=5)],
        forget=[],
        keep_ms=KEEP_MS,
    )
    now = store_time_ms(queue)
    assert dues[0] is not None
    assert dues[0] <= now  # a due time already past is due at once
    assert dues[1] == later
    stored = queue.peek("later")
    assert stored is not None
    assert (stored.state, stored.score_ms, stored.budget, stored.attempt) == (
        "pending",
        later,
        5,
        0,
    )
    assert [message.id for message in queue.fetch(10).messages] == ["past"]


def test_a_message_relayed_again_is_not_written_again(queue: Queue) -> None:
    queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS)
    # Still held: not written again.
    assert queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS) == [None]
    [message] = queue.fetch(10).messages
    queue.ack([message])
    assert queue.peek("m1") is None
    # Handled and acked: the queue no longer knows it, and it is still not written again.
    assert queue.store.relay([relayed("m1"), relayed("m2")], forget=[], keep_ms=KEEP_MS)[0] is None
    assert states_of(queue, "m1") == []
    assert states_of(queue, "m2") == ["pending"]


def test_an_id_the_queue_knows_is_not_overwritten(queue: Queue) -> None:
    [known] = queue.send_many(["sent directly"])
    assert queue.store.relay([relayed(known, '"other"')], forget=[], keep_ms=KEEP_MS) == [None]
    assert queue.peek(known).payload == '"sent directly"'  # type: ignore[union-attr]


def test_forgotten_ids_may_be_relayed_again(queue: Queue) -> None:
    """Forgetting is for ids whose outbox rows are deleted for good: after it, the same id
    is new again (a relay never brings it back; this shows that the note is gone)."""
    queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS)
    [message] = queue.fetch(10).messages
    queue.ack([message])
    assert queue.store.relay([], forget=["m1"], keep_ms=KEEP_MS) == []
    dues = queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS)
    assert dues[0] is not None


def test_ids_never_forgotten_are_dropped_after_keep_ms(queue: Queue) -> None:
    queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS)
    [message] = queue.fetch(10).messages
    queue.ack([message])
    time.sleep(0.05)
    # A call with a keep_ms shorter than the note's age drops it on the way.
    assert queue.store.relay([], forget=[], keep_ms=10) == []
    assert queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS)[0] is not None


def test_a_relay_wakes_idle_workers(queue: Queue) -> None:
    subscription = queue.store.subscribe_wakeups()
    try:
        queue.store.relay([relayed("m1", at_ms=1)], forget=[], keep_ms=KEEP_MS)
        assert wait_for(lambda: subscription.wait(1.0), what="a wake-up") > 0
    finally:
        subscription.close()


@pytest.mark.parametrize("size", [1, 3])
def test_a_large_relay_goes_in_send_batches(configure: Callable[..., Queue], size: int) -> None:
    queue = configure(SEND_BATCH_SIZE=size)
    messages = [relayed(f"m{n}") for n in range(7)]
    queue.store.relay(messages[:2], forget=[], keep_ms=KEEP_MS)
    dues = queue.store.relay(messages, forget=[], keep_ms=KEEP_MS)
    assert [due is None for due in dues] == [True, True] + [False] * 5
    assert queue.stats()["pending"] == 7


def test_keep_ms_counts_from_the_last_relay_of_an_id(queue: Queue) -> None:
    """Regression: an id relayed again (its batch's commit failed again and again) was
    dropped keep_ms after its first relay, and a relay after that wrote it a second time."""
    queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS)
    time.sleep(0.5)
    assert queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS) == [None]
    [message] = queue.fetch(10).messages
    queue.ack([message])
    # Noted 0.5 s ago first, just now last: a keep_ms between the two keeps it.
    assert queue.store.relay([], forget=[], keep_ms=300) == []
    assert queue.store.relay([relayed("m1")], forget=[], keep_ms=KEEP_MS) == [None]
    assert states_of(queue, "m1") == []


def test_the_messages_a_relay_writes_count_as_sent(queue: Queue) -> None:
    queue.store.relay([relayed("m1"), relayed("m2")], forget=[], keep_ms=KEEP_MS)
    queue.store.relay([relayed("m1"), relayed("m3")], forget=[], keep_ms=KEEP_MS)  # m1 again
    assert sum(point.sent for point in queue.metrics(since=timedelta(minutes=2))) == 3
