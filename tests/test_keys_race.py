"""The keys race (issue #26): three producer processes send, cancel and reschedule a handful
of shared keys in random order while two ``run_delayqueue`` workers drain the queue, some
first deliveries failing (back to wait for a retry, or superseded by a newer message with
the key); the test samples the queue all along. At every instant at most one message waits
per key; afterwards every message a send created was handled exactly once, cancelled or
superseded (as many as the queue counted), with the content of a send that wrote it, and
the queue and its key index are empty.

Small here (a few seconds each); tests/chaos/test_keys_race.py runs it longer under
``make chaos``."""

from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from tests.chaos.fleet import WorkerFleet
from tests.keys_race.scenario import check, drained_and_sound, race, worker_settings
from tests.redis_servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(
    params=[
        "standalone",
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("sharded-cluster", marks=pytest.mark.cluster),
    ]
)
def race_settings(request: pytest.FixtureRequest, redis_server: RedisServer) -> dict[str, Any]:
    """The race's queue: on the single Redis, on the 3-master Cluster, and sharded over it
    (6 shards: each key checked on its own shard)."""
    if request.param == "standalone":
        return worker_settings(redis_server.url)
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    cluster.flush()
    shards = {"SHARDS": 6} if request.param == "sharded-cluster" else {}
    return worker_settings(cluster.url, **shards)


def test_racing_producers_leave_one_waiting_message_per_key(
    race_settings: dict[str, Any], settings: Any, tmp_path: Path
) -> None:
    for name, value in race_settings.items():
        setattr(settings, name, value)
    queue = get_queue()
    fleet = WorkerFleet(tmp_path, race_settings, size=2)
    try:
        events, deliveries, samples = race(queue, fleet, producers=3, seconds=3, keys=5)
    finally:
        fleet.close()
    check(events, deliveries, samples, queue.store.totals().get("superseded", 0))
    drained_and_sound(queue)
