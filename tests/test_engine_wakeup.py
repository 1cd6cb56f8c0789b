"""Idle workers are woken through pub/sub when work comes due earlier than they planned."""

import time
from typing import Any

from delayqueue_django.queue import Queue


class Listener:
    def __init__(self, queue: Queue) -> None:
        client: Any = queue.store.client  # RedisCluster.pubsub() has no annotations
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(queue.store.keys.wakeup_channel)
        first = self.pubsub.get_message(timeout=2)
        assert first is not None
        assert first["type"] == "subscribe"

    def wakeups(self, wait: float = 0.2) -> list[int]:
        found = []
        deadline = time.monotonic() + wait
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.pubsub.get_message(timeout=remaining)
            if message and message["type"] == "message":
                found.append(int(message["data"]))
        return found

    def close(self) -> None:
        self.pubsub.close()


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
