"""Redis crashes under load (``kill -9``, AOF on) and comes back from its AOF: workers resume
on their own, and nothing is lost beyond what the fsync policy allows by design.

With ``appendfsync always`` a write is on disk before Redis replies, so nothing acknowledged
may be lost. With ``everysec`` a write is handed to the kernel before the reply and fsynced
within about a second (two at most, when the disk lags): a crash of the Redis process alone
loses nothing the kernel holds, a crash of the machine may lose the acknowledged writes of
the last two seconds. The test allows that window and reports what was actually lost.
"""

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from tests.chaos import ledger
from tests.chaos.accounting import drain, first_handled_after, lost_outside_windows, tally
from tests.chaos.conftest import queue_settings
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.producer import Producer
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.chaos

EVERYSEC_WINDOW = 2.0  # seconds of acknowledged writes everysec may lose, by design
CONSUME_SECONDS = 2


@pytest.fixture
def aof_server(request: pytest.FixtureRequest) -> Any:
    server = RedisServer("--appendonly", "yes", "--appendfsync", request.param)
    yield server
    server.close()


@pytest.mark.parametrize("aof_server", ["everysec", "always"], indirect=True)
def test_redis_crashes_and_restarts_from_its_aof(
    aof_server: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_rounds: int,
) -> None:
    fsync = aof_server.extra_args[-1]
    config = queue_settings(aof_server.url, MAX_CONSUME_DURATION=CONSUME_SECONDS)
    queue = use_settings(config)
    fleet = fleets(config, "--concurrency", "2", size=2)
    fleet.start()
    fleet.wait_started()
    producer = Producer(queue, rate=400)
    producer.start()
    rng = random.Random(5)
    crashes: list[tuple[float, float]] = []
    problems = []
    for _ in range(chaos_rounds):
        time.sleep(rng.uniform(1.0, 2.0))
        crashed_at = time.time()
        aof_server.crash()
        time.sleep(rng.uniform(0.2, 1.0))
        aof_server.start()  # returns once the AOF is loaded and Redis answers
        crashes.append((crashed_at, time.time()))
        problems += queue.check_invariants().problems
    time.sleep(1.5)
    producer.stop()
    drain(queue, timeout=CONSUME_SECONDS * 3 + 10)
    entries = ledger.read(fleet.ledger)
    result = tally(producer.sent, entries)
    final = queue.check_invariants()
    exit_codes = fleet.stop()

    recoveries = [first_handled_after(back, producer.sent, entries) for _, back in crashes]
    report_figures(
        Figures(
            f"Redis kill -9, AOF {fsync}",
            len(producer.sent),
            len(result.lost),
            result.duplicates,
            max(recoveries),
            f"{len(crashes)} crashes; sends refused meanwhile: {sum(producer.failures.values())}",
        )
    )
    assert producer.unexpected == []
    assert problems == []
    assert final.ok, final.problems
    assert final.counts["garbage"] == 0
    if fsync == "always":
        assert result.lost == []
    else:
        assert lost_outside_windows(result, producer.sent, crashes, EVERYSEC_WINDOW) == []
    assert set(exit_codes.values()) == {0}, fleet.output()
