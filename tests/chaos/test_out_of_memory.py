"""Redis out of memory (``maxmemory`` with ``noeviction``): ``send`` raises the package's
``RedisOutOfMemory``, nothing of the refused batch is written, and a worker started on the
full Redis drains it, dead letters and their announcements included, so memory frees up and
sends are accepted again."""

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.exceptions import OutOfMemoryError

from delayqueue_django.core.queue import Queue
from delayqueue_django.exceptions import DelayQueueError, RedisOutOfMemory
from tests.chaos import ledger
from tests.chaos.accounting import drain, tally
from tests.chaos.conftest import queue_settings
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.helpers import wait_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.chaos

MESSAGES = 500


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    server = RedisServer("--maxmemory-policy", "noeviction")
    yield server
    server.close()


def squeeze(server: RedisServer, headroom: int) -> None:
    """Set maxmemory ``headroom`` bytes below what Redis uses now: it is out of memory until
    that much is freed."""
    client = server.client()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used - headroom)
    client.close()


def test_a_full_redis_refuses_sends_clearly_and_workers_drain_it(
    full_redis: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
) -> None:
    config = queue_settings(full_redis.url, MAX_CONSUME_DURATION=3)
    queue = use_settings(config)
    accepted = queue.send_many(
        [{"n": n, "reject": n % 10 == 0, "pad": "x" * 4000} for n in range(MESSAGES)]
    )
    squeeze(full_redis, headroom=MESSAGES * 4000 // 4)

    with pytest.raises(RedisOutOfMemory) as refused:
        queue.send_many([{"n": n, "pad": "y" * 4000} for n in range(50)])
    error = refused.value
    assert isinstance(error, DelayQueueError)
    assert isinstance(error, OutOfMemoryError)  # what code catching redis errors expects
    assert "Redis is out of memory and refused messages for queue 'default'" in str(error)
    assert "maxmemory" in str(error)
    report = queue.check_invariants()  # runs on the full Redis
    assert report.ok, report.problems
    assert report.messages == len(accepted)  # the refused batch left nothing behind

    # Heartbeats, exhaustion claims and throughput counts all want memory too: the worker
    # must drain the queue all the same.
    fleet = fleets(config, "--concurrency", "2", "--heartbeat", "0.5", size=1)
    started = time.time()
    fleet.start()
    late = wait_for(lambda: _try_send(queue), timeout=20, what="a send to be accepted again")
    recovery = time.time() - started
    drain(queue, timeout=30)
    wait_for(lambda: queue.stats()["unannounced"] == 0, timeout=30, what="the announcements")
    entries = ledger.read(fleet.ledger)
    result = tally([*accepted, late], entries)
    final = queue.check_invariants()
    exit_codes = fleet.stop()

    report_figures(
        Figures(
            "Redis out of memory (noeviction)",
            len(accepted) + 1,
            len(result.lost),
            result.duplicates,
            recovery,
            "recovery: from starting a worker (a new process) to a send accepted again",
        )
    )
    assert result.lost == [], fleet.output()
    assert final.ok, final.problems
    rejected = sum(1 for entry in entries if entry.event == "rejected")
    assert final.counts["garbage"] == rejected > 0  # the dead letters, announced
    assert set(exit_codes.values()) == {0}, fleet.output()


def _try_send(queue: Queue) -> str | None:
    try:
        return queue.send({"n": "after"})
    except RedisOutOfMemory:
        time.sleep(0.1)
        return None
