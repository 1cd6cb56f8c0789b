"""Redis clients for queues: a django-redis cache's pool, or one built from a URL.

Clients built from URLs are shared by every queue with the same URL and OPTIONS, and
forgotten when settings change.
"""

import threading
from typing import Any

from redis import Redis
from redis.cluster import RedisCluster

from delayqueue_django.conf import CLUSTER_URL_SCHEMES, QueueConfig
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
