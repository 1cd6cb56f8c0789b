"""The keys race (tests/test_keys_race.py) at size: five producers racing on eight keys
against three workers, on a queue sharded over the 3-master Cluster, for
``--chaos-messages / 1000`` seconds (3 in make test, 100 in make chaos)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.keys_race.scenario import check, drained_and_sound, race, summary, worker_settings
from tests.redis_servers import RedisClusterServers

pytestmark = [pytest.mark.chaos, pytest.mark.cluster]


def test_keys_race_at_size(
    redis_cluster: RedisClusterServers,
    chaos_messages: int,
    settings: Any,
    tmp_path: Path,
    report_figures: Callable[[Figures], None],
) -> None:
    redis_cluster.flush()
    race_settings = worker_settings(redis_cluster.url, SHARDS=6)
    for name, value in race_settings.items():
        setattr(settings, name, value)
    queue = get_queue()
    seconds = max(chaos_messages // 1000, 3)
    fleet = WorkerFleet(tmp_path, race_settings, size=3)
    try:
        events, deliveries, samples = race(queue, fleet, producers=5, seconds=seconds, keys=8)
    finally:
        fleet.close()
    check(events, deliveries, samples, queue.store.totals().get("superseded", 0))
    drained_and_sound(queue)
    created = sum(event.get("outcome") == "created" for event in events)
    report_figures(
        Figures(
            f"keys race: 5 producers, 8 keys, {seconds} s",
            created,
            0,
            0,
            None,
            summary(events, deliveries),
        )
    )
