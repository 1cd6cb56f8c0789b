"""Ordered groups (tests/test_groups_workers.py) at size: ``--chaos-messages / 30`` grouped
messages (in 20 groups) drained by three workers on a queue sharded over the 3-master
Cluster, a random worker killed (kill -9) every second meanwhile: within each group never
two at once nor out of order, every message handled, none lost."""

import random
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
    worker_settings,
)
from tests.redis_servers import RedisClusterServers

pytestmark = [pytest.mark.chaos, pytest.mark.cluster]

GROUPS = 20


def test_groups_hold_their_order_through_kills(
    redis_cluster: RedisClusterServers, chaos_messages: int, settings: Any, tmp_path: Path
) -> None:
    redis_cluster.flush()
    flow_settings = worker_settings(redis_cluster.url, SHARDS=6, MAX_CONSUME_DURATION=2)
    for name, value in flow_settings.items():
        setattr(settings, name, value)
    queue = get_queue()
    # 100 messages in a small run (the default 3000), 3,300 in make chaos (100,000).
    per_group = max(chaos_messages // (GROUPS * 30), 5)
    rng = random.Random(27)
    special = {
        (rng.randrange(GROUPS), rng.randrange(per_group)): {"fail": True} for _ in range(GROUPS)
    }
    send_groups(queue, GROUPS, per_group, special)
    fleet = WorkerFleet(tmp_path, flow_settings, size=3)
    deadline = time.monotonic() + 600
    try:
        fleet.start()
        while any(queue.stats()[state] for state in ("pending", "ready", "unack", "retry")):
            assert time.monotonic() < deadline, fleet.output()
            time.sleep(1)
            fleet.kill_one(rng)
    finally:
        fleet.stop()
        fleet.close()
    by_group = deliveries(fleet)
    check_order(by_group, per_group)
    check_parallel(by_group)
    assert queue.stats()["garbage"] == 0
