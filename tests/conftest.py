from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayqueue_django import get_queue
from delayqueue_django.queue import Queue
from tests.chaos.figures import (  # noqa: F401  (pytest hooks: options and the figures table)
    pytest_addoption,
    pytest_configure,
    pytest_terminal_summary,
)
from tests.redis_servers import RedisClusterServers, RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(masters=3)
    yield cluster
    cluster.close()


def queue_settings(url: str, **options: Any) -> dict[str, dict[str, Any]]:
    return {
        "default": {"URL": url, **options},
        "other": {"URL": url, "RETRY_COUNT": 0},
    }


@pytest.fixture(autouse=True)
def _private_redis(redis_server: RedisServer, settings: Any) -> None:
    """Every test starts with an empty private Redis and queues pointing at it."""
    redis_server.client().flushall()
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server.url},
    }
    settings.DELAYQUEUES = queue_settings(redis_server.url)


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend_url(request: pytest.FixtureRequest, redis_server: RedisServer, settings: Any) -> str:
    """Runs a test once on a single Redis and once on a 3-master Redis Cluster."""
    if request.param == "cluster":
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        cluster.flush()
        settings.DELAYQUEUES = queue_settings(cluster.url)
        return cluster.url
    return redis_server.url


@pytest.fixture
def configure(backend_url: str, settings: Any) -> Callable[..., Queue]:
    """``configure(**options)``: set the default queue's options, return the queue."""

    def configure(**options: Any) -> Queue:
        settings.DELAYQUEUES = queue_settings(backend_url, **options)
        return get_queue("default")

    return configure


@pytest.fixture
def queue(configure: Callable[..., Queue]) -> Queue:
    return configure()


@pytest.fixture
def raw(queue: Queue) -> redis.Redis | redis.RedisCluster:
    """The queue's own Redis client, for looking at and damaging its keys directly."""
    return queue.store.client
