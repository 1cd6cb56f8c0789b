"""The Redis clients the package builds from a queue's URL: socket timeouts, TCP keepalive
and health checks by default (redis-py before 8 sets none), OPTIONS over them, and OPTIONS
the client would refuse stopped before they reach it."""

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue, send
from delayqueue_django.core import connections
from delayqueue_django.core.conf.client import (
    CONNECT_TIMEOUT_SECONDS,
    HEALTH_CHECK_SECONDS,
    SOCKET_TIMEOUT_SECONDS,
    keepalive_options,
)
from delayqueue_django.exceptions import QueueConfigurationError
from delayqueue_django.monitoring.reports import queue_report
from tests.helpers import redis_store
from tests.redis_servers import RedisServer
from tests.tcp_relay import TcpRelay

pytestmark = pytest.mark.timeout(60)

DEFAULTS = {
    "socket_timeout": SOCKET_TIMEOUT_SECONDS,
    "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "socket_keepalive": True,
    "socket_keepalive_options": keepalive_options(),
    "health_check_interval": HEALTH_CHECK_SECONDS,
}


def pool_arguments(pool: Any, names: Any = DEFAULTS) -> dict[str, Any]:
    return {name: pool.connection_kwargs.get(name) for name in names}


def pool_of(queue: Any) -> Any:
    """The connection pool of a queue's standalone client."""
    client: Any = redis_store(queue).client
    return client.connection_pool


def test_a_url_client_gets_timeouts_keepalive_and_health_checks() -> None:
    assert pool_arguments(pool_of(get_queue())) == DEFAULTS
    assert keepalive_options()  # this platform names them: they are really set


def test_options_win_over_the_defaults(redis_server: RedisServer, settings: Any) -> None:
    options = {"socket_timeout": 1.5, "socket_keepalive": False, "health_check_interval": 0}
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "OPTIONS": options}}
    pool = pool_of(get_queue())
    assert pool_arguments(pool, options) == options
    assert pool.connection_kwargs["socket_connect_timeout"] == 5.0


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[RedisServer]:
    socket_path = tmp_path / "redis.sock"
    server = RedisServer("--unixsocket", str(socket_path), "--unixsocketperm", "700")
    server.socket_path = socket_path  # type: ignore[attr-defined]
    yield server
    server.close()


def test_a_unix_socket_client_gets_the_defaults_it_takes(
    unix_redis: RedisServer, settings: Any
) -> None:
    url = f"unix://{unix_redis.socket_path}?db=0"  # type: ignore[attr-defined]
    settings.DELAYQUEUES = {"default": {"URL": url}}
    queue = get_queue()
    # No TCP keepalive on a unix socket (redis-py would refuse the keyword).
    expected = {**DEFAULTS, "socket_keepalive": None, "socket_keepalive_options": None}
    assert pool_arguments(pool_of(queue)) == expected
    message_id = queue.send("over a unix socket")
    assert [m.id for m in queue.fetch().messages] == [message_id]


@pytest.mark.cluster
def test_each_cluster_node_gets_timeouts_and_keepalive(settings: Any, redis_cluster: Any) -> None:
    redis_cluster.flush()
    settings.DELAYQUEUES = {"default": {"URL": redis_cluster.url}}
    queue = get_queue()
    queue.send("x")
    client: Any = redis_store(queue).client
    # RedisCluster passes no health_check_interval on to its nodes (the check refuses it).
    names = [name for name in DEFAULTS if name != "health_check_interval"]
    pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
    assert pools
    for pool in pools:
        assert pool_arguments(pool, names) == {name: DEFAULTS[name] for name in names}


def test_an_asyncio_client_gets_them_too() -> None:
    config = get_queue().config

    async def pool_of_the_async_client() -> Any:
        client: Any = connections.async_client_for(config)
        assert client is not None
        return client.connection_pool

    pool = asyncio.run(pool_of_the_async_client())
    assert pool_arguments(pool) == DEFAULTS


def test_options_only_the_sync_client_takes_leave_async_code_on_it(settings: Any) -> None:
    # redis.asyncio has no OCSP checks: async methods then run the sync client in a thread.
    options = {"ssl_validate_ocsp": False}
    settings.DELAYQUEUES = {"default": {"URL": "rediss://127.0.0.1:1/0", "OPTIONS": options}}
    config = get_queue().config

    async def async_client() -> Any:
        return connections.async_client_for(config)

    assert asyncio.run(async_client()) is None


def test_stats_over_a_silently_dropped_connection_answer_within_the_socket_timeout(
    redis_server: RedisServer, settings: Any
) -> None:
    relay = TcpRelay(redis_server.port)
    try:
        settings.DELAYQUEUES = {"default": {"URL": relay.url}}
        queue = get_queue()
        assert queue_report(queue)["ok"]  # over a pooled connection, idle from now on
        relay.freeze()
        started = time.monotonic()
        # What delayqueue_stats (--watch: every round) asks: answered, not waited for forever.
        report = queue_report(queue)
        assert time.monotonic() - started < SOCKET_TIMEOUT_SECONDS + 5
        assert not report["ok"]
        assert report["error"].startswith(
            f"queue 'default': Redis at 127.0.0.1:{relay.port} did not answer in time, so the "
            "call may or may not have run: Timeout reading from"  # redis-py's wording varies
        )
        assert queue_report(queue)["ok"]  # and the next round, on a new connection
    finally:
        relay.close()


# A cache alias's own pool


def alias_settings(settings: Any, redis_server: RedisServer, db: int, **options: Any) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "queues": {
            "BACKEND": "django_redis.cache.RedisCache",
            # django-redis keeps one pool per URL for the life of the process.
            "LOCATION": f"redis://127.0.0.1:{redis_server.port}/{db}",
            "OPTIONS": options,
        },
    }
    settings.DELAYQUEUES = {
        "default": {"REDIS": "queues", "HANDLER": "tests.worker_handlers.handle"}
    }


def test_the_worker_warns_when_a_cache_pool_has_no_socket_timeout(
    settings: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    alias_settings(settings, redis_server, 1, CONNECTION_POOL_KWARGS={"socket_timeout": None})
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        call_command("run_delayqueue", burst=True, stdout=StringIO())
    assert (
        "queue=default: the connection pool of cache 'queues' sets no socket_timeout: a "
        "connection that a NAT or firewall drops silently stalls this worker for good. Set "
        "CACHES['queues']['OPTIONS'] 'SOCKET_TIMEOUT' and 'SOCKET_CONNECT_TIMEOUT' (and "
        "CONNECTION_POOL_KWARGS for keepalive and health checks; see Connections in the docs' "
        "Redis settings page)."
    ) in caplog.text


def test_a_cache_pool_with_a_socket_timeout_draws_no_warning(
    settings: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    alias_settings(settings, redis_server, 2, SOCKET_TIMEOUT=5, SOCKET_CONNECT_TIMEOUT=5)
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        call_command("run_delayqueue", burst=True, stdout=StringIO())
    assert "socket_timeout" not in caplog.text


# OPTIONS that the client would refuse


@pytest.fixture
def misspelt(redis_server: RedisServer, settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": redis_server.url,
            "HANDLER": "tests.worker_handlers.handle",
            "OPTIONS": {"socket_timout": 5},
        }
    }


MISSPELT = (
    "delayqueue_django.E017: DELAYQUEUES['default']['OPTIONS'] has 'socket_timout', which "
    "redis-py's Redis client does not accept."
)


@pytest.mark.usefixtures("misspelt")
def test_a_worker_with_a_misspelt_option_stops_at_once() -> None:
    with pytest.raises(CommandError, match=re.escape(MISSPELT)):
        call_command("run_delayqueue", burst=True, stdout=StringIO())


@pytest.mark.usefixtures("misspelt")
def test_send_with_a_misspelt_option_raises_a_configuration_error() -> None:
    with pytest.raises(QueueConfigurationError, match=re.escape(MISSPELT)):
        send("x")


@pytest.mark.usefixtures("misspelt")
def test_stats_with_a_misspelt_option_is_a_command_error() -> None:
    with pytest.raises(CommandError, match=re.escape(MISSPELT)):
        call_command("delayqueue_stats", stdout=StringIO())


def test_options_the_client_takes_all_pass(redis_server: RedisServer, settings: Any) -> None:
    options = {
        "socket_timeout": 2,
        "socket_connect_timeout": 2,
        "health_check_interval": 10,
        "retry_on_timeout": True,
        "max_connections": 50,
        "client_name": "worker",
        "single_connection_client": False,
        "username": "default",
    }
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "OPTIONS": options}}
    queue = get_queue()
    assert queue.send("x")
    assert dataclasses.asdict(queue.config)["options"] == options
