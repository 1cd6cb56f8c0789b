"""The flow gates (issue #27) with three ``run_delayqueue`` processes on a real Redis:
handed-out counts never above the rate limit in any window of its period, handlers in
flight never above the cap, and a pause that holds for 10 s with messages due, all of
them going out within a second of the resume. Small here (seconds, but the pause's 10 s);
tests/chaos/test_flow_gates.py runs them longer, and kills workers under each gate."""

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from tests.chaos.fleet import WorkerFleet
from tests.flow_gates.scenario import (
    busiest_window,
    drain,
    ledger_of,
    most_at_once,
    worker_settings,
)
from tests.helpers import store_time_ms, wait_for
from tests.redis_servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.timeout(120)


def configured(settings: Any, url: str, **options: Any) -> dict[str, Any]:
    chosen = worker_settings(url, **options)
    for name, value in chosen.items():
        setattr(settings, name, value)
    return chosen


# Each gate on one Redis, and on a sharded queue (one budget for the whole queue on shard 0,
# see engine.flow) over the three masters of a Redis Cluster, six shards, two a master.
PLACES = {
    "one server": ("redis_server", {}),
    "sharded on a cluster": ("redis_cluster", {"SHARDS": 6}),
}


def place_url(request: pytest.FixtureRequest, place: str) -> str:
    """The URL of ``place``'s server, emptied: the Cluster is the session's, which other
    tests may have left with messages, or paused."""
    server = request.getfixturevalue(PLACES[place][0])
    if isinstance(server, RedisClusterServers):
        server.flush()
    return str(server.url)


def drained(
    request: pytest.FixtureRequest,
    place: str,
    settings: Any,
    tmp_path: Path,
    count: int,
    **options: Any,
) -> list[dict[str, Any]]:
    """``count`` messages drained by three workers with these queue options, at ``place``:
    the ledger of their handler."""
    url = place_url(request, place)
    chosen = configured(settings, url, **PLACES[place][1], **options)
    queue = get_queue()
    queue.send_many([{"n": n} for n in range(count)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=3)
    try:
        fleet.start()
        return drain(queue, fleet, count, timeout=60)
    finally:
        fleet.close()


@pytest.mark.parametrize("place", PLACES)
def test_three_workers_never_hand_out_more_than_the_rate_limit(
    request: pytest.FixtureRequest, place: str, settings: Any, tmp_path: Path
) -> None:
    records = drained(request, place, settings, tmp_path, 70, RATE_LIMIT="20/s")
    handed_out = [record["handed_out_ms"] for record in records]
    assert busiest_window(handed_out, 1000) <= 20
    # The limit did hold them back: 70 at 20 a second take three seconds and more.
    assert max(handed_out) - min(handed_out) >= 3000


@pytest.mark.parametrize("place", PLACES)
def test_three_workers_never_run_more_than_the_cap_at_once(
    request: pytest.FixtureRequest, place: str, settings: Any, tmp_path: Path
) -> None:
    records = drained(request, place, settings, tmp_path, 60, MAX_IN_FLIGHT=3)
    assert 2 <= most_at_once(records) <= 3


@pytest.mark.parametrize("place", PLACES)
def test_a_pause_holds_due_messages_until_the_resume(
    request: pytest.FixtureRequest, place: str, settings: Any, tmp_path: Path
) -> None:
    chosen = configured(settings, place_url(request, place), **PLACES[place][1])
    queue = get_queue()
    queue.pause()
    queue.send_many([{"n": n} for n in range(30)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=3)
    try:
        fleet.start()
        fleet.wait_started()
        # The proof: ten seconds paused with every message due, none handed out.
        held_until = time.monotonic() + 10
        while time.monotonic() < held_until:
            assert ledger_of(fleet.ledger) == []
            time.sleep(0.5)
        assert queue.stats()["due"] + queue.stats()["ready"] == 30
        queue.resume()
        resumed_ms = store_time_ms(queue)
        records = drain(queue, fleet, 30, timeout=30)
    finally:
        fleet.close()
    assert max(record["handed_out_ms"] for record in records) - resumed_ms <= 1000


def test_a_killed_workers_slots_of_a_sharded_cap_come_back_when_its_leases_run_out(
    redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    chosen = configured(
        settings,
        redis_server.url,
        SHARDS=4,
        MAX_IN_FLIGHT=3,
        MAX_CONSUME_DURATION=3,
        HANDLER="tests.flow_gates.handler.hold",
    )
    queue = get_queue()
    queue.send_many([{"n": n} for n in range(10)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=1)
    try:
        fleet.start()
        wait_for(lambda: queue.stats()["unack"] == 3, timeout=30, what="the cap taken")
        taken_at = time.monotonic()
        (worker,) = fleet.running
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        # Its slots are held by shard 0 for the whole queue until its leases run out.
        assert queue.fetch(10).messages == []
        back = wait_for(lambda: queue.fetch(10).messages, timeout=8, what="the slots back")
        came_back_after = time.monotonic() - taken_at
    finally:
        fleet.close()
    assert len(back) == 3
    assert 2.0 <= came_back_after <= 5.0
