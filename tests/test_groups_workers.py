"""Ordered groups (issue #27) with three ``run_delayqueue`` worker processes on real Redis:
the handlers' records show that within a group never two ran at once nor out of order,
while groups ran in parallel; a failing message holds its group until it succeeds or is
dead-lettered; a worker killed (kill -9) while holding a group: the group goes on once the
delivery's lease ran out, nothing lost. Small here; tests/chaos/test_groups_kill.py runs it
larger under ``make chaos``."""

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from tests.chaos.fleet import WorkerFleet
from tests.groups_flow.scenario import (
    check_order,
    check_parallel,
    deliveries,
    send_groups,
    wait_drained,
    worker_settings,
)
from tests.keys_race import journal
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(120)


def run_fleet(settings: Any, tmp_path: Path, worker_settings_: dict[str, Any]) -> WorkerFleet:
    for name, value in worker_settings_.items():
        setattr(settings, name, value)
    return WorkerFleet(tmp_path, worker_settings_, size=3)


def test_groups_run_one_at_a_time_in_order_and_in_parallel(
    redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    fleet = run_fleet(settings, tmp_path, worker_settings(redis_server.url))
    queue = get_queue()
    groups, per_group = 4, 6
    # Failing first deliveries hold their group for their retry; (2, 1) is dead-lettered
    # after its one retry, and its group goes on.
    special: dict[tuple[int, int], dict[str, Any]] = {
        (0, 1): {"fail": True},
        (1, 3): {"fail": True},
        (2, 1): {"always_fail": True},
        (3, 0): {"sleep": 0.3},
    }
    send_groups(queue, groups, per_group, special)
    try:
        fleet.start()
        wait_drained(queue, fleet, timeout=60)
    finally:
        fleet.stop()
        fleet.close()
    by_group = deliveries(fleet)
    check_order(by_group, per_group)
    check_parallel(by_group)
    dead = [run for run in by_group["g2"] if run["seq"] == 1]
    assert [run["done"] for run in dead] == [False, False]
    assert queue.stats()["garbage"] == 1
    assert (
        sum(len(runs) for runs in by_group.values()) == groups * per_group + 3
    )  # the two retries, the dead one's second attempt


def test_a_killed_holder_frees_its_group_when_its_lease_runs_out(
    redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    fleet = run_fleet(settings, tmp_path, worker_settings(redis_server.url, MAX_CONSUME_DURATION=2))
    queue = get_queue()
    groups, per_group = 3, 4
    send_groups(queue, groups, per_group, {(0, 1): {"hang": True}})
    try:
        fleet.start()
        deadline = time.monotonic() + 30
        while not (
            hung := [
                e
                for e in journal.read(fleet.ledger)
                if e["group"] == "g0" and e["seq"] == 1 and e["event"] == "start"
            ]
        ):
            assert time.monotonic() < deadline, fleet.output()
            time.sleep(0.05)
        pid = hung[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        fleet.running = [process for process in fleet.running if process.pid != pid]
        fleet.start()  # a replacement, as an orchestrator would start one
        wait_drained(queue, fleet, timeout=60)
    finally:
        fleet.stop()
        fleet.close()
    by_group = deliveries(fleet)
    check_order(by_group, per_group)
    runs = [run for run in by_group["g0"] if run["seq"] == 1]
    assert [(run["attempt"], run["done"]) for run in runs] == [(1, None), (2, True)]
    # The group waited for the lease (2 s) before its next delivery.
    assert runs[1]["at"] - runs[0]["at"] >= 1.9
    assert queue.stats()["garbage"] == 0
