"""Redis clients for queues: a django-redis cache's pool, or one built from a URL.

Clients built from URLs are shared by every queue with the same URL and OPTIONS, and
forgotten when settings change.
"""

import asyncio
import threading
import weakref
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from delayqueue_django.conf import CLUSTER_URL_SCHEMES, QueueConfig
from delayqueue_django.engine.async_store import AsyncRedisClient
from delayqueue_django.engine.store import RedisClient

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
_ClientsByUrl = dict[tuple[str, str], AsyncRedisClient]
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
            scheme, _, rest = config.url.partition("://")
            options = dict(config.options)
            if scheme in CLUSTER_URL_SCHEMES:
                plain = scheme.removesuffix("+cluster")
                clients[key] = AsyncRedisCluster.from_url(f"{plain}://{rest}", **options)
            else:
                clients[key] = AsyncRedis.from_url(config.url, **options)
        return clients[key]


def _from_url(url: str, options: dict[str, Any]) -> RedisClient:
    scheme, _, rest = url.partition("://")
    if scheme in CLUSTER_URL_SCHEMES:
        plain_scheme = scheme.removesuffix("+cluster")
        return RedisCluster.from_url(f"{plain_scheme}://{rest}", **options)
    return Redis.from_url(url, **options)


def reset() -> None:
    """Forget the clients built from URLs (called when settings change).

    They are not closed: code may still hold a Queue using one, and a closed RedisCluster
    client cannot be used again. Their pools are released when the last user drops them.
    """
    with _lock:
        _clients.clear()
        _async_clients.clear()
