"""MAX_IN_FLIGHT with a worker whose handlers are shorter than a second (issue #33): the cap is
never exceeded, and a slot an ack frees is taken again at once, not at the held-back fetch's
look a second later (a cap of N acted as a rate of N a second). A queue whose fetches the
cap did not hold back pays no fetch per ack for it. On one shard and sharded, on Redis and
in memory."""

import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.worker import Worker
from tests.conftest import MEMORY_URL
from tests.flow_gates.scenario import most_at_once
from tests.helpers import wait_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(60)

CAP = 3
HANDLER_SECONDS = 0.3
MESSAGES = 15

PLACES = {
    "redis": ("redis", {}),
    "redis sharded": ("redis", {"SHARDS": 3}),
    "memory": ("memory", {}),
    "memory sharded": ("memory", {"SHARDS": 4}),
}

_records: list[dict[str, float]] = []
_records_lock = threading.Lock()


def timed(message: Message) -> None:
    started = time.monotonic()
    time.sleep(HANDLER_SECONDS)
    with _records_lock:
        _records.append({"started": started, "ended": time.monotonic()})


def handled(count: int) -> bool:
    with _records_lock:
        return len(_records) >= count


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest, redis_server: RedisServer, settings: Any) -> Any:
    store, options = PLACES[request.param]
    url = redis_server.url if store == "redis" else MEMORY_URL

    def configure(**more: Any) -> Queue:
        settings.DELAYQUEUES = {"default": {"URL": url, **options, **more}}
        return get_queue()

    with _records_lock:
        _records.clear()
    return configure


@pytest.fixture
def run_worker() -> Iterator[Any]:
    started: list[tuple[Worker, threading.Thread]] = []

    def start(queue: Queue, concurrency: int) -> None:
        worker = Worker([(queue, timed)], concurrency=concurrency, heartbeat_interval=10)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))

    yield start
    for worker, thread in started:
        worker.request_stop()
        thread.join(timeout=10)


def test_an_ack_under_the_cap_refills_its_slot_at_once(place: Any, run_worker: Any) -> None:
    queue = place(MAX_IN_FLIGHT=CAP)
    queue.send_many([{"n": n} for n in range(MESSAGES)])
    # More threads than the cap: only the cap holds the worker back.
    run_worker(queue, concurrency=2 * CAP)
    wait_for(partial(handled, MESSAGES), timeout=30, what="every message handled")
    with _records_lock:
        records = list(_records)
    # Never above the cap, and at it while the backlog lasted.
    assert most_at_once(records) == CAP
    # Each start after the first CAP waited for a slot: it came within a few ms of the end
    # that freed it (before, 0.7 s: until the held-back fetch looked again, a second on).
    ends = sorted(record["ended"] for record in records)
    starts = sorted(record["started"] for record in records)
    waits = [start - max(end for end in ends if end <= start) for start in starts[CAP:]]
    assert sorted(waits)[len(waits) // 2] < 0.1, waits
    # 15 at 3 at a time, 0.3 s each: 1.5 s; at "3 a second", 4.7 s.
    assert max(ends) - min(starts) < 3.0, waits


@pytest.mark.parametrize("cap", [None, CAP])
def test_acks_a_cap_did_not_hold_back_cost_no_fetch(
    place: Any, run_worker: Any, cap: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One message at a time to an idle worker: the cap never holds a fetch back, so an ack
    # keeps the plan of the fetch before it (nothing due), as on a queue without a cap.
    queue = place(**({} if cap is None else {"MAX_IN_FLIGHT": cap}))
    fetches: list[int] = []
    real_fetch = Queue.fetch

    def counting_fetch(self: Queue, count: int | None = None, **kw: Any) -> Any:
        fetched = real_fetch(self, count, **kw)
        fetches.append(len(fetched.messages))
        return fetched

    monkeypatch.setattr(Queue, "fetch", counting_fetch)
    run_worker(queue, concurrency=1)
    wait_for(lambda: fetches, what="the worker's first fetch")
    messages = 6
    for n in range(messages):
        queue.send({"n": n})
        wait_for(partial(handled, n + 1), timeout=5, what="the message handled")
        time.sleep(0.05)  # its ack is committed meanwhile
    empty = [count for count in fetches if count == 0]
    assert sum(fetches) == messages
    # The first fetch at start, the odd one a wake-up makes that finds the message taken:
    # not one per ack.
    assert len(empty) <= 1 + messages // 3, fetches
