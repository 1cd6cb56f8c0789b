"""Redis clients for queues: a django-redis cache's pool, or one built from a URL.

Clients built from URLs get the package's connection defaults (socket timeouts, TCP
keepalive, health checks: see core.conf.client) under the queue's OPTIONS; they are shared by
every queue with the same URL and OPTIONS, and forgotten when settings change.
"""

import asyncio
import threading
import weakref
from typing import Any
from urllib.parse import urlsplit

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from delayqueue_django.core.conf import client as client_options
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.engine.async_store import AsyncRedisClient
from delayqueue_django.engine.store.base import RedisClient

_clients: dict[tuple[str, str], RedisClient] = {}
_lock = threading.Lock()


def client_for(config: QueueConfig) -> RedisClient:
    if config.redis_alias is not None:
        from django_redis import get_redis_connection

        client: RedisClient = get_redis_connection(config.redis_alias)
        return client
    assert config.url is not None  # conf guarantees exactly one of the two
    key = (config.url, repr(sorted(config.options.items())))
    with _lock:
        if key not in _clients:
            _clients[key] = _from_url(config.url, dict(config.options))
        return _clients[key]


# redis.asyncio clients belong to the event loop they were made in: one set per loop.
_ClientsByUrl = dict[tuple[str, str], AsyncRedisClient | None]
_async_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ClientsByUrl]" = (
    weakref.WeakKeyDictionary()
)


def async_client_for(config: QueueConfig) -> AsyncRedisClient | None:
    """A redis.asyncio client for this event loop, or None for a django-redis alias (which has
    no asyncio client; callers then use the sync client in a thread) or a memory queue."""
    if config.url is None or config.memory_name is not None:
        return None
    loop = asyncio.get_running_loop()
    key = (config.url, repr(sorted(config.options.items())))
    with _lock:
        clients = _async_clients.setdefault(loop, {})
        if key not in clients:
            clients[key] = _async_from_url(config.url, dict(config.options))
        return clients[key]


def address(config: QueueConfig, client: Any = None) -> str:
    """Where a queue's Redis is, for messages and logs: host:port, a socket's path, a Redis
    Cluster node or a Sentinel service; never credentials. ``client``: the queue's, which
    tells where a django-redis alias leads."""
    if config.url is not None:
        return config.url if config.memory_name is not None else _url_address(config.url)
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service is not None:
        return f"the master of Sentinel service {service!r}"
    where = getattr(pool, "connection_kwargs", {})
    if where.get("path"):
        return str(where["path"])
    if where.get("host"):
        return _host_port(str(where["host"]), where.get("port"))
    return f"cache {config.redis_alias!r}"


def _url_address(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    try:
        port = parts.port
    except ValueError:  # the system check refuses such a URL; say what is known
        port = None
    where = _host_port(parts.hostname or "localhost", port)
    return f"{where} (Redis Cluster)" if client_options.is_cluster_url(url) else where


def _host_port(host: str, port: Any) -> str:
    return f"[{host}]:{port or 6379}" if ":" in host else f"{host}:{port or 6379}"


def _from_url(url: str, options: dict[str, Any]) -> RedisClient:
    arguments = client_options.with_defaults(url, options)
    if client_options.is_cluster_url(url):
        return RedisCluster.from_url(client_options.redis_py_url(url), **arguments)
    return Redis.from_url(url, **arguments)


def _async_from_url(url: str, options: dict[str, Any]) -> AsyncRedisClient | None:
    if client_options.unknown_options(url, options, asyncio=True):
        # OPTIONS only the sync client takes (the system check validated them for that
        # one): the queue's async methods then use it in a thread, as for an alias.
        return None
    arguments = client_options.with_defaults(url, options, asyncio=True)
    if client_options.is_cluster_url(url):
        return AsyncRedisCluster.from_url(client_options.redis_py_url(url), **arguments)
    return AsyncRedis.from_url(url, **arguments)


def reset() -> None:
    """Forget the clients built from URLs (called when settings change).

    They are not closed: code may still hold a Queue using one, and a closed RedisCluster
    client cannot be used again. Their pools are released when the last user drops them.
    """
    with _lock:
        _clients.clear()
        _async_clients.clear()
