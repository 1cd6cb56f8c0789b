"""A queue on a django-redis cache alias that goes through Redis Sentinel."""

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

import delayqueue_django as delayqueue
from tests.redis_servers import RedisSentinel
from tests.worker_handlers import read_log


@pytest.fixture(scope="module")
def sentinel() -> Iterator[RedisSentinel]:
    servers = RedisSentinel()
    yield servers
    servers.close()


def test_send_and_consume_through_a_sentinel_cache_alias(
    sentinel: RedisSentinel, settings: Any
) -> None:
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        **settings.CACHES,
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{sentinel.service}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "SENTINELS": [("127.0.0.1", sentinel.port)],
            },
        },
    }
    settings.DELAYQUEUES = {
        "default": {"REDIS": "sentinel", "HANDLER": "tests.worker_handlers.handle"}
    }
    sentinel.master.client().flushall()

    message_id = delayqueue.send({"via": "sentinel"})
    assert sentinel.master.client().zscore("{delayqueue:default}:pending", message_id) is not None
    call_command("run_delayqueue", burst=True, stdout=StringIO())
    assert [e["id"] for e in read_log() if e["event"] == "done"] == [message_id]
    assert delayqueue.get_queue().stats()["pending"] == 0
