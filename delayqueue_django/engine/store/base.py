"""What every part of a ``RedisStore`` stands on: its client, key layout and limits, the
scripts, the server's version checked once, and ``_run``, the one way a part calls a
script (its warnings logged). The version check and the warnings are shared with
``AsyncRedisStore``."""

import logging
import threading
from collections.abc import Sequence
from typing import Any, TypeAlias

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from delayqueue_django.engine.errors import UnsupportedRedisVersion
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.records import StoreLimits, loggable
from delayqueue_django.engine.scripts import Lua, send_keys
from delayqueue_django.engine.store.replies import _shown

logger = logging.getLogger("delayqueue_django.engine")

RedisClient: TypeAlias = Redis | RedisCluster

# Functions (FUNCTION LOAD, FCALL) arrived in Redis 7.0; Valkey, which has them from its
# first release, 7.2, reports itself as that Redis version.
MINIMUM_REDIS_VERSION = (7, 0)


def oldest_version(info: dict[str, Any]) -> tuple[int, ...]:
    """The server's version from INFO server; on a cluster, the oldest node's."""
    if "redis_version" in info:
        versions = [info["redis_version"]]
    else:  # RedisCluster answers with one dict per node.
        versions = [node["redis_version"] for node in info.values() if isinstance(node, dict)]
    return min(tuple(int(part) for part in str(v).split(".")[:3]) for v in versions)


def require_supported(version: tuple[int, ...], queue: str) -> None:
    if version < MINIMUM_REDIS_VERSION:
        found = ".".join(map(str, version))
        needed = ".".join(map(str, MINIMUM_REDIS_VERSION))
        raise UnsupportedRedisVersion(
            f"delayqueue_django needs Redis {needed} or newer; queue {queue!r} is on Redis {found}"
        )


def log_warnings(queue: str, warnings: Sequence[Sequence[bytes | str]]) -> None:
    """The scripts' warnings: their subjects (an id, a key) and reasons (naming a field, a
    schedule) are read from Redis, where anyone may have written them."""
    for subject, reason in warnings:
        logger.warning(
            "damaged queue state queue=%s subject=%s: %s",
            queue,
            loggable(_shown(subject)),
            loggable(_shown(reason)),
        )


class RedisStoreBase:
    """A store's client, keys and limits, and its calls to the scripts."""

    def __init__(self, client: RedisClient, keys: QueueKeys, limits: StoreLimits) -> None:
        self.client = client
        self.keys = keys
        self.limits = limits
        self._layout = keys.layout
        self._channel = keys.wakeup_channel
        self._lua = Lua(client)
        # A send's call, on the layout's first key alone but on Redis Cluster
        # (scripts.FIRST_KEY_ONLY), its head built once (Lua.bound): a send per message pays
        # for its own arguments only.
        self._send_keys = send_keys(self._layout, cluster=isinstance(client, RedisCluster))
        self._send_call = self._lua.bound("send", self._send_keys)
        self._version_checked = False
        self._version_lock = threading.Lock()

    def server_name(self) -> str:
        if not isinstance(self.client, RedisCluster):
            return f"client {id(self.client)}"  # one server, or Sentinel's current master
        # The slot's node unknown for now: a server of its own.
        return self.cluster_master() or f"slot of {self.keys.tag}"

    def cluster_master(self) -> str:
        """``host:port`` of the Redis Cluster master holding this store's keys, as the client
        last learned the cluster's slots (no round trip); "" off Redis Cluster, or when no
        master is known to hold them."""
        if not isinstance(self.client, RedisCluster):
            return ""
        nodes: Any = self.client  # (redis-py's cluster methods are untyped)
        try:
            return str(nodes.get_node_from_key(self.keys.tag).name)
        except RedisClusterException:  # its slot is covered by no master
            return ""

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    @property
    def uses_scripts(self) -> bool:
        """Whether the Lua runs as EVALSHA scripts: the server refused Functions."""
        return self._lua.uses_scripts

    def check_server(self) -> None:
        """Refuse a Redis too old for the scripts (asked once per store)."""
        if self._version_checked:
            return
        with self._version_lock:
            if self._version_checked:
                return
            require_supported(oldest_version(self.client.info("server")), self.keys.queue)
            self._version_checked = True

    def _run(self, name: str, args: Sequence[Any], extra_keys: Sequence[str] = ()) -> Any:
        self.check_server()
        keys = [*self._layout, *extra_keys] if extra_keys else self._layout
        reply = self._lua(name, keys, args)
        log_warnings(self.keys.queue, reply[-1])
        return reply

    def place(self, message_ids: list[str], keys: Sequence[str | None] | None = None) -> list[str]:
        """New ids as this store files them: as they are (one queue, one set of keys)."""
        return message_ids
