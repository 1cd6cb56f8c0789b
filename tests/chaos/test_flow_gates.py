"""The flow gates (tests/test_flow_gates_workers.py) at size: three workers drain a backlog
under RATE_LIMIT for 30 s in make chaos (3 s in make test), never more than the limit in
any window of its period; and workers killed with ``kill -9`` under MAX_IN_FLIGHT leave no
slot taken for good: their leases run out, every message is handled, and the cap still
lets as many run at once afterwards."""

import random
import time
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from tests.chaos.fleet import WorkerFleet
from tests.flow_gates.scenario import busiest_window, drain, most_at_once, worker_settings
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

RATE = 20


def configured(settings: Any, url: str, **options: Any) -> dict[str, Any]:
    chosen = worker_settings(url, **options)
    for name, value in chosen.items():
        setattr(settings, name, value)
    return chosen


def test_rate_limit_holds_over_the_whole_drain(
    redis_server: RedisServer, chaos_messages: int, settings: Any, tmp_path: Path
) -> None:
    seconds = min(max(chaos_messages // 3000, 3), 30)
    chosen = configured(settings, redis_server.url, RATE_LIMIT=f"{RATE}/s")
    queue = get_queue()
    count = RATE * seconds
    queue.send_many([{"n": n} for n in range(count)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=3)
    try:
        fleet.start()
        records = drain(queue, fleet, count, timeout=seconds * 3 + 30)
    finally:
        fleet.close()
    handed_out = [record["handed_out_ms"] for record in records]
    assert busiest_window(handed_out, 1000) <= RATE
    # Accuracy: the drain took as long as the limit says, and not much longer.
    took_ms = max(handed_out) - min(handed_out)
    assert (seconds - 1) * 1000 <= took_ms <= seconds * 1000 * 1.5


def test_workers_killed_under_the_cap_leak_no_slot(
    redis_server: RedisServer, chaos_messages: int, settings: Any, tmp_path: Path
) -> None:
    cap, kills = 3, min(max(chaos_messages // 20000, 2), 5)
    chosen = configured(settings, redis_server.url, MAX_IN_FLIGHT=cap)
    queue = get_queue()
    count = 100 * kills
    queue.send_many([{"n": n} for n in range(count)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=3)
    rng = random.Random(27)
    try:
        fleet.start()
        fleet.wait_started()
        for _ in range(kills):
            time.sleep(rng.uniform(0.5, 1.5))
            fleet.kill_one(rng)
        records = drain(queue, fleet, count, timeout=120)
    finally:
        fleet.close()
    # Every message handled: the killed workers' slots came back when their leases ran out.
    assert len({record["id"] for record in records}) == count
    assert most_at_once(records) <= cap
    stats = queue.stats()
    assert stats["unack"] + stats["pending"] + stats["ready"] + stats["retry"] == 0
