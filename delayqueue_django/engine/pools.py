"""Renewing a client's idle connections once one of them was found silently dead."""

import inspect
from functools import cache
from typing import Any

from redis.cluster import RedisCluster


def drop_idle_connections(client: Any) -> None:
    """Close the connections idle in ``client``'s pools (each reconnects at its next use);
    those in use by other threads are left alone.

    For when a connection was found silently dead (no reply in time): a NAT or firewall that
    forgot one flow forgot its idle siblings too, and finding each of them dead in turn would
    cost a whole socket timeout apiece.
    """
    for pool in _pools(client):
        if _spares_connections_in_use(pool.__class__):
            pool.disconnect(inuse_connections=False)


def _pools(client: Any) -> list[Any]:
    if isinstance(client, RedisCluster):
        cluster: Any = client  # redis-py leaves get_nodes untyped
        nodes = cluster.get_nodes()
        return [node.redis_connection.connection_pool for node in nodes if node.redis_connection]
    pool = getattr(client, "connection_pool", None)
    return [] if pool is None else [pool]


@cache
def _spares_connections_in_use(pool_class: Any) -> bool:
    """Whether the pool can close only its idle connections (BlockingConnectionPool before
    redis-py 7 always closes every one, those other threads are using included)."""
    return "inuse_connections" in inspect.signature(pool_class.disconnect).parameters
