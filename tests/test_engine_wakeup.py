"""Idle workers are woken when work comes due earlier than they planned (Redis: pub/sub; the
memory store: a condition variable), through the store's wake-up subscription."""

from typing import Any

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import WakeupSubscription
from tests.backends import one_shard


class Listener:
    def __init__(self, queue: Queue) -> None:
        self.subscription: WakeupSubscription = queue.store.subscribe_wakeups()

    def wakeups(self, wait: float = 0.2) -> list[int]:
        """Every wake-up announced within ``wait`` seconds, with the due time it announced."""
        found = []
        while (due := self.subscription.wait(timeout=wait)) is not None:
            found.append(due)
        return found

    def close(self) -> None:
        self.subscription.close()


@one_shard
def test_a_message_due_earlier_than_all_others_wakes_idle_workers(queue: Queue) -> None:
    listener = Listener(queue)
    try:
        queue.send("first", delay=60)
        [first] = listener.wakeups()
        queue.send("later", delay=120)
        assert listener.wakeups() == []  # not earlier: sleeping workers wake in time anyway
        queue.send("sooner", delay=1)
        [sooner] = listener.wakeups()
        assert sooner < first
    finally:
        listener.close()


@one_shard
def test_a_full_batch_with_more_waiting_passes_the_baton(queue: Queue) -> None:
    queue.send_many(range(5))
    listener = Listener(queue)
    try:
        assert len(queue.fetch(2).messages) == 2
        assert len(listener.wakeups()) == 1
        assert len(queue.fetch(10).messages) == 3
        assert listener.wakeups() == []  # all taken: nobody else needs waking
    finally:
        listener.close()


def test_release_and_requeue_wake_idle_workers(queue: Queue) -> None:
    queue.send("x", retry_count=0)
    [message] = queue.fetch(1).messages
    listener = Listener(queue)
    try:
        queue.release([message])
        assert len(listener.wakeups()) == 1
        [message] = queue.fetch(1).messages
        queue.nack([message])
        queue.requeue([message.id])
        assert len(listener.wakeups()) == 1
    finally:
        listener.close()


def test_a_closed_subscription_hears_nothing_more(queue: Queue) -> None:
    listener = Listener(queue)
    other = Listener(queue)
    listener.close()
    queue.send("x")
    assert len(other.wakeups()) == 1
    other.close()


def test_next_wakeup_is_the_earliest_due_time_or_deadline(configure: Any) -> None:
    queue = configure(MAX_CONSUME_DURATION=5)
    queue.send("in flight")
    [message] = queue.fetch(1).messages
    queue.send("later", delay=60)
    result = queue.fetch(1)
    assert result.next_ms == message.deadline_ms
    queue.ack([message])
    result = queue.fetch(1)
    [pending] = queue.list_messages("pending")
    assert result.next_ms == pending.score_ms
