"""Sentinel failover under load, through a django-redis Sentinel cache alias: the master is
killed (``kill -9``), the sentinel promotes its replica, and producers and workers, which ask
the sentinel where the master is, follow on their own. As with Redis Cluster, replication is
asynchronous: writes the master acknowledged but had not streamed to its replica when it died
may be lost (the last second before the kill is allowed; what was lost is reported).
"""

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from tests.chaos.conftest import queue_settings
from tests.chaos.failover import conclude_failover
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.producer import Producer
from tests.redis_servers import RedisSentinel

pytestmark = pytest.mark.chaos

CONSUME_SECONDS = 3


@pytest.fixture
def sentinel() -> Iterator[RedisSentinel]:
    # Its own service name: django-redis keeps Sentinel pools by URL (redis://<service>/0)
    # across settings changes, so a name shared with another test would reach its sentinel.
    servers = RedisSentinel("chaos-master", replicas=1)
    yield servers
    servers.close()


def sentinel_settings(sentinel: RedisSentinel) -> dict[str, Any]:
    """A django-redis Sentinel cache alias, and the queue on it (JSON, for the workers too)."""
    return {
        "DJANGO_REDIS_CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
        "CACHES": {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "queues": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"redis://{sentinel.service}/0",
                "OPTIONS": {
                    "CLIENT_CLASS": "django_redis.client.SentinelClient",
                    "SENTINELS": [["127.0.0.1", sentinel.port]],
                    "SOCKET_TIMEOUT": 1,
                    "SOCKET_CONNECT_TIMEOUT": 1,
                },
            },
        },
        **queue_settings(redis="queues", MAX_CONSUME_DURATION=CONSUME_SECONDS),
    }


def test_the_sentinel_fails_over_under_load_and_everyone_follows(
    sentinel: RedisSentinel,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_rounds: int,
) -> None:
    config = sentinel_settings(sentinel)
    queue = use_settings(config)
    fleet = fleets(config, "--concurrency", "2", size=2)
    fleet.start()
    fleet.wait_started()
    producer = Producer(queue, rate=300)
    producer.start()
    rng = random.Random(9)
    failovers: list[tuple[float, float]] = []
    problems = []
    for _ in range(chaos_rounds):
        time.sleep(rng.uniform(1.0, 2.0))
        master = sentinel.current_master()
        killed_at = time.time()
        master.crash()
        sentinel.wait_for_failover(master)
        failovers.append((killed_at, time.time()))
        problems += queue.check_invariants().problems
        sentinel.restart_as_replica(master)
        sentinel.wait_until_replicated()
    conclude_failover(
        "Sentinel: master kill -9, replica promoted",
        queue,
        fleet,
        producer,
        failovers,
        problems,
        report_figures,
        consume_seconds=CONSUME_SECONDS,
    )
