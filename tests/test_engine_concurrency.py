"""Many producers and consumers at once, with no client-side locks."""

import threading
from collections import Counter
from typing import Any

from delayqueue_django.core.queue import Queue
from tests.helpers import states_of


def run_threads(count: int, target: Any) -> None:
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()


def test_concurrent_consumers_each_get_every_message_exactly_once(queue: Queue) -> None:
    total = 5000
    ids = set(queue.send_many(range(total)))
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def consume(_: int) -> None:
        while True:
            fetched = queue.fetch(50)
            with lock:
                seen.update(m.id for m in fetched.messages)
            queue.ack(fetched.messages)
            if not fetched.messages and fetched.next_ms is None:
                return

    run_threads(4, consume)
    assert set(seen) == ids
    assert max(seen.values()) == 1


def test_concurrent_producers_lose_nothing(queue: Queue) -> None:
    sent: list[str] = []
    lock = threading.Lock()

    def produce(index: int) -> None:
        mine = [queue.send({"producer": index, "n": n}) for n in range(300)]
        with lock:
            sent.extend(mine)

    run_threads(4, produce)
    assert queue.stats()["pending"] == len(set(sent)) == 1200


def test_cancel_racing_fetch_is_truthful(queue: Queue) -> None:
    """For every message exactly one side wins: cancel returns True or a consumer gets it."""
    ids = queue.send_many(range(2000))
    cancelled: set[str] = set()
    delivered: Counter[str] = Counter()
    lock = threading.Lock()

    def work(index: int) -> None:
        if index % 2 == 0:
            for message_id in ids[index // 2 :: 2]:
                if queue.cancel(message_id):
                    with lock:
                        cancelled.add(message_id)
        else:
            for _ in range(200):
                fetched = queue.fetch(20)
                with lock:
                    delivered.update(m.id for m in fetched.messages)
                queue.ack(fetched.messages)

    run_threads(4, work)
    while fetched := queue.fetch(100).messages:
        delivered.update(m.id for m in fetched)
        queue.ack(fetched)

    assert cancelled.isdisjoint(delivered)
    assert cancelled | set(delivered) == set(ids)
    assert max(delivered.values(), default=1) == 1
    assert all(states_of(queue, message_id) == [] for message_id in ids[:50])
