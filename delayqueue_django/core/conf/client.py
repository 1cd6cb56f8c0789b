"""The keyword arguments of the Redis clients built from a queue's ``URL``: the package's
connection defaults under the queue's ``OPTIONS``, and the names each client accepts.

The accepted names are read from redis-py's own signatures (the client's ``from_url``, its
connection pool and the connection class the URL's scheme selects), so a typo such as
``socket_timout`` is refused by the system check instead of raising ``TypeError`` at the
first connection, and the answer follows the installed redis-py version.
"""

import inspect
import socket
from collections.abc import Callable, Mapping
from functools import cache
from types import ModuleType
from typing import Any

import redis.asyncio.connection as async_connection
import redis.connection as sync_connection
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import KWARGS_DISABLED_KEYS, REDIS_ALLOWED_KEYS, RedisCluster

CLUSTER_URL_SCHEMES = ("redis+cluster", "rediss+cluster")

# Every connection the package builds gets these unless OPTIONS (or the URL's query string)
# says otherwise: without them redis-py before 8.0 waits forever on a connection that a NAT
# or firewall dropped silently (see "Connections" in docs/operations/redis.md).
SOCKET_TIMEOUT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 5.0
# A pooled connection idle this long is PINGed before its next command.
HEALTH_CHECK_SECONDS = 30
# TCP keepalive: first probe after 30 s idle, then every 5 s; 3 unanswered probes close
# the connection (the values redis-py 8 uses by default).
KEEPALIVE_IDLE_SECONDS = 30
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_PROBES = 3


def keepalive_options() -> dict[int, int]:
    """The TCP keepalive settings this platform supports (macOS names the idle time
    TCP_KEEPALIVE)."""
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    wanted = (
        (idle, KEEPALIVE_IDLE_SECONDS),
        (getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_SECONDS),
        (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES),
    )
    return {option: value for option, value in wanted if option is not None}


def connection_defaults() -> dict[str, Any]:
    return {
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": SOCKET_TIMEOUT_SECONDS,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options(),
        "health_check_interval": HEALTH_CHECK_SECONDS,
    }


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0] in CLUSTER_URL_SCHEMES


def redis_py_url(url: str) -> str:
    """The URL as redis-py reads it (``redis+cluster://`` is the package's own spelling)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.removesuffix('+cluster')}://{rest}"


def client_description(url: str) -> str:
    return "RedisCluster" if is_cluster_url(url) else "Redis"


def _keywords(function: Callable[..., Any]) -> tuple[set[str], bool]:
    """The names ``function`` takes by keyword, and whether it takes ``**kwargs`` too."""
    parameters = inspect.signature(function).parameters.values()
    named = {
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self", "cls")
    }
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


def _constructor_keywords(cls: type) -> set[str]:
    """Every name ``cls(...)`` accepts: its own ``__init__``'s, and its bases' for as long as
    each ``__init__`` passes ``**kwargs`` on."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if klass is object or init is None:
            continue
        named, passes_on = _keywords(init)
        names |= named
        if not passes_on:
            break
    return names


# Taken out of the keyword arguments before the connection class sees them (by the sync
# Redis.from_url, and by the connection pool for client-side caching), so no connection
# signature lists them; each counts only where the client's own __init__ has it.
_TAKEN_BEFORE_THE_CONNECTION = ("single_connection_client", "cache", "cache_config")


@cache
def _standalone_names(
    connection_module: ModuleType, client: Any, connection: type
) -> frozenset[str]:
    from_url, _ = _keywords(client.from_url)
    client_init, _ = _keywords(client.__init__)
    return frozenset(
        (from_url - {"url"})
        | _constructor_keywords(connection_module.ConnectionPool)
        | _constructor_keywords(connection)
        | {name for name in _TAKEN_BEFORE_THE_CONNECTION if name in client_init}
    )


@cache
def _cluster_names(asyncio: bool) -> frozenset[str]:
    if asyncio:
        # Its __init__ takes no **kwargs: every name it accepts is in its signature.
        return frozenset(_keywords(AsyncRedisCluster.__init__)[0] - {"url"})
    # RedisCluster passes on to each node's client only the names in redis-py's list of
    # them, dropping any other without a word.
    named, _ = _keywords(RedisCluster.__init__)
    passed_on = set(REDIS_ALLOWED_KEYS) - set(KWARGS_DISABLED_KEYS)
    return frozenset((named | passed_on) - {"url"})


def accepted_options(
    url: str, options: Mapping[str, Any], *, asyncio: bool = False
) -> frozenset[str]:
    """The OPTIONS names the client for ``url`` accepts (sync, or redis.asyncio's).

    Raises ValueError when redis-py cannot read the URL.
    """
    if is_cluster_url(url):
        return _cluster_names(asyncio)
    connection_module = async_connection if asyncio else sync_connection
    client = AsyncRedis if asyncio else Redis
    connection = options.get("connection_class")
    if not isinstance(connection, type):
        connection = connection_module.parse_url(url).get(
            "connection_class", connection_module.Connection
        )
    return _standalone_names(connection_module, client, connection)


def unknown_options(url: str, options: Mapping[Any, Any], *, asyncio: bool = False) -> list[Any]:
    """OPTIONS names the client for ``url`` would refuse (or, on Redis Cluster, ignore)."""
    accepted = accepted_options(url, options, asyncio=asyncio)
    return [name for name in options if name not in accepted]


def with_defaults(url: str, options: Mapping[str, Any], *, asyncio: bool = False) -> dict[str, Any]:
    """The keyword arguments for the client: the package's defaults that this client takes,
    overridden by OPTIONS."""
    accepted = accepted_options(url, options, asyncio=asyncio)
    defaults = {name: value for name, value in connection_defaults().items() if name in accepted}
    return {**defaults, **options}


def effective_connection_option(pool: Any, name: str) -> Any:
    """The value ``pool``'s connections get for ``name``: the pool's own keyword argument,
    else the connection class's default (which differs between redis-py versions)."""
    arguments = getattr(pool, "connection_kwargs", {})
    if name in arguments:
        return arguments[name]
    for klass in getattr(pool, "connection_class", object).__mro__:
        init = vars(klass).get("__init__")
        if klass is object or init is None:
            continue
        parameter = inspect.signature(init).parameters.get(name)
        if parameter is not None:
            return None if parameter.default is parameter.empty else parameter.default
        if not _keywords(init)[1]:
            break
    return None
