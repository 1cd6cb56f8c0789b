"""The flow gates (tests/test_flow_gates_workers.py) at size: three workers drain a backlog
under RATE_LIMIT for 30 s in make chaos (3 s in make test), never more than the limit in
any window of its period. Workers killed with ``kill -9`` lose nothing under each gate:
under MAX_IN_FLIGHT they leave no slot taken for good (their leases run out, every message
is handled, and the cap still lets as many run at once afterwards); under RATE_LIMIT the
redeliveries of what they held stay within the limit; around a pause, what they held comes
back when its leases run out but is not handed out until the resume."""

import random
import time
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.chaos.fleet import WorkerFleet
from tests.flow_gates.scenario import (
    CONSUME_MS,
    busiest_window,
    drain,
    ledger_of,
    most_at_once,
    worker_settings,
)
from tests.helpers import store_time_ms
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


def drained_through_kills(
    url: str,
    settings: Any,
    tmp_path: Path,
    count: int,
    kills: int,
    seed: int,
    gaps: tuple[float, float],
    timeout: float,
    **options: Any,
) -> list[dict[str, Any]]:
    """``count`` messages drained by three workers with these queue options, ``kills``
    of them killed with ``kill -9`` (each after a pause drawn from ``gaps``) and replaced;
    checks that every message was handled and the queue is empty, and returns the
    handler's ledger."""
    chosen = configured(settings, url, **options)
    queue = get_queue()
    queue.send_many([{"n": n} for n in range(count)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=3)
    rng = random.Random(seed)
    try:
        fleet.start()
        fleet.wait_started()
        for _ in range(kills):
            time.sleep(rng.uniform(*gaps))
            fleet.kill_one(rng)
        records = drain(queue, fleet, count, timeout=timeout)
    finally:
        fleet.close()
    assert len({record["id"] for record in records}) == count
    assert_empty(queue)
    return records


def assert_empty(queue: Queue) -> None:
    stats = queue.stats()
    assert stats["unack"] + stats["pending"] + stats["ready"] + stats["retry"] == 0


def test_workers_killed_under_the_cap_leak_no_slot(
    redis_server: RedisServer, chaos_messages: int, settings: Any, tmp_path: Path
) -> None:
    cap, kills = 3, min(max(chaos_messages // 20000, 2), 5)
    # Every message handled: the killed workers' slots came back when their leases ran out.
    records = drained_through_kills(
        redis_server.url,
        settings,
        tmp_path,
        100 * kills,
        kills,
        27,
        (0.5, 1.5),
        120,
        MAX_IN_FLIGHT=cap,
    )
    assert most_at_once(records) <= cap


def test_workers_killed_under_the_rate_limit_lose_nothing_nor_burst(
    redis_server: RedisServer, chaos_messages: int, settings: Any, tmp_path: Path
) -> None:
    seconds = min(max(chaos_messages // 3000, 3), 30)
    kills = min(max(chaos_messages // 20000, 2), 5)
    # The killed workers' deliveries come back when their leases run out.
    timeout = seconds * 3 + kills * CONSUME_MS / 1000 + 30
    records = drained_through_kills(
        redis_server.url,
        settings,
        tmp_path,
        RATE * seconds,
        kills,
        2701,
        (0.3, seconds / kills),
        timeout,
        RATE_LIMIT=f"{RATE}/s",
    )
    # Redeliveries of what the killed workers held count against the limit like any other
    # hand-out: the window holds over all of them.
    assert busiest_window([record["handed_out_ms"] for record in records], 1000) <= RATE


def test_workers_killed_around_a_pause_lose_nothing_and_hand_out_nothing_while_paused(
    redis_server: RedisServer, chaos_messages: int, settings: Any, tmp_path: Path
) -> None:
    kills = min(max(chaos_messages // 20000, 2), 5)
    chosen = configured(settings, redis_server.url)
    queue = get_queue()
    count = 400
    queue.send_many([{"n": n} for n in range(count)])
    fleet = WorkerFleet(tmp_path, chosen, "--concurrency", "4", size=3)
    rng = random.Random(2702)
    try:
        fleet.start()
        fleet.wait_started()
        deadline = time.monotonic() + 30
        while len(ledger_of(fleet.ledger)) < 20:
            assert time.monotonic() < deadline, fleet.output()
            time.sleep(0.02)
        # Killed mid-drain, a worker leaves deliveries in flight; the pause comes while
        # their leases run.
        fleet.kill_one(rng)
        queue.pause()
        paused_ms = store_time_ms(queue)
        for _ in range(kills - 1):
            time.sleep(rng.uniform(0.2, 1.0))
            fleet.kill_one(rng)
        # Past every killed delivery's lease: taken back, but not handed out while paused.
        time.sleep(CONSUME_MS / 1000 + 1.5)
        held = ledger_of(fleet.ledger)
        stats = queue.stats()
        assert stats["paused"]
        assert len({record["id"] for record in held}) < count
        # (Read before the resume: its wake-up may have a worker fetch before a read after.)
        resuming_ms = store_time_ms(queue)
        queue.resume()
        records = drain(queue, fleet, count, timeout=60)
    finally:
        fleet.close()
    assert all(record["handed_out_ms"] <= paused_ms for record in held)
    assert all(
        record["handed_out_ms"] <= paused_ms or record["handed_out_ms"] >= resuming_ms
        for record in records
    )
    assert len({record["id"] for record in records}) == count
    assert_empty(queue)
