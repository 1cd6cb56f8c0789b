"""What an operator should know about a queue's Redis, found by asking it: a server too old
for the queue's Lua, an eviction policy that may delete the queue's keys, and a django-redis
pool without a socket timeout.

The system checks never contact Redis; these run where Redis is used anyway: at worker start
(logged), and in ``delayqueue_check`` and ``delayqueue_stats`` (printed). A queue spread
over shards is asked on every server that holds one (each Redis Cluster master), and
advice about one server names the shards on it.
"""

import logging
from dataclasses import dataclass, replace
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.core.conf import client as client_options
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.sharding.store import parts

# The queue's keys that carry a TTL: all a volatile-* policy may evict.
KEYS_WITH_A_TTL = (
    "worker heartbeats (a live worker then looks gone), fetch replay records (a fetch whose "
    "reply was lost then gets new messages, and the lost ones come back only after "
    "MAX_CONSUME_DURATION) and task results"
)


@dataclass(frozen=True)
class Advice:
    queue: str
    level: int  # logging.WARNING or logging.INFO
    text: str
    # About one server of a queue whose shards are on several (Redis Cluster's masters):
    # the shards it holds, and where it is. Empty when the advice is about the whole queue.
    shards: tuple[str, ...] = ()
    server: str = ""

    @property
    def label(self) -> str:
        return "warning" if self.level >= logging.WARNING else "note"

    @property
    def message(self) -> str:
        """The text, after the shards it is about (when not all of the queue's)."""
        if not self.shards:
            return self.text
        shards = "shard " if len(self.shards) == 1 else "shards "
        return f"{shards}{', '.join(self.shards)} (on {self.server}): {self.text}"

    def __str__(self) -> str:
        return f"{self.label}: queue {self.queue!r}: {self.message}"


def advise(queues: list[Queue]) -> list[Advice]:
    """Advice for each queue on Redis: for each of its parts (every shard of a sharded
    queue, see ``engine.sharding.store.parts``), on the server that holds it. A Redis that
    cannot be reached is asked nothing more (the caller reports it anyway); each server is
    asked once. Raises UnsupportedRedisVersion for a server older than the queue's Lua
    needs: nothing else matters then."""
    advice: list[Advice] = []
    policies: dict[tuple[int, str], Any] = {}
    unreachable: set[tuple[int, str]] = set()
    for queue in queues:
        stores = {
            name: store
            for name, store in parts(queue.store).items()
            if isinstance(store, RedisStore)
        }
        if queue.config.redis_alias is not None:
            clients = {id(store.client): store.client for store in stores.values()}
            for client in clients.values():
                advice += _pool_advice(queue, client)
        # The queue's shards by the server holding them (one, "", off Redis Cluster).
        servers: dict[tuple[int, str], list[str]] = {}
        for name, store in stores.items():
            servers.setdefault((id(store.client), store.cluster_master()), []).append(name)
        for key, names in servers.items():
            store = stores[names[0]]
            if key in unreachable or (isinstance(store.client, RedisCluster) and not key[1]):
                continue  # (a cluster slot no master covers: no one to ask)
            try:
                for name in names:
                    stores[name].check_server()
                if key not in policies:
                    policies[key] = _memory_config(store)
            except (RedisConnectionError, RedisTimeoutError):
                unreachable.add(key)
                continue
            said = _eviction_advice(queue.name, policies[key])
            if len(servers) > 1:
                said = [replace(one, shards=tuple(names), server=key[1]) for one in said]
            advice += said
    return advice


def _memory_config(store: RedisStore) -> dict[str, str] | RedisError:
    """maxmemory and maxmemory-policy of the server holding the queue's keys, or the error
    of a server that refuses CONFIG (managed services often do)."""
    client: Any = store.client
    if isinstance(store.client, RedisCluster):
        client = client.get_redis_connection(client.get_node_from_key(store.keys.key("pending")))
    try:
        reply = client.config_get("maxmemory*")
    except (RedisConnectionError, RedisTimeoutError):
        raise
    except RedisError as refused:
        return refused
    return {_text(name): _text(value) for name, value in reply.items()}


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _eviction_advice(queue: str, config: dict[str, str] | RedisError) -> list[Advice]:
    if isinstance(config, RedisError):
        return [
            Advice(
                queue,
                logging.INFO,
                f"could not check Redis's maxmemory-policy (CONFIG GET refused: {config}); "
                "make sure it is noeviction: an allkeys-* policy deletes queues without a word.",
            )
        ]
    policy = config.get("maxmemory-policy", "noeviction")
    limit = int(config.get("maxmemory", "0") or 0)
    when = f"at its maxmemory ({limit} bytes)" if limit else "once a maxmemory is set"
    if policy.startswith("allkeys-"):
        return [
            Advice(
                queue,
                logging.WARNING,
                f"Redis's maxmemory-policy is {policy}: {when} it evicts any key, the queue's "
                "included, and messages are lost without a word (whole queues at once). Give "
                "the queue a Redis whose maxmemory-policy is noeviction.",
            )
        ]
    if policy.startswith("volatile-"):
        return [
            Advice(
                queue,
                logging.INFO,
                f"Redis's maxmemory-policy is {policy}: {when} it may evict the queue's keys "
                f"that carry a TTL: {KEYS_WITH_A_TTL}. Messages carry none and are never "
                "evicted; noeviction keeps the rest too.",
            )
        ]
    return []


def _pool_advice(queue: Queue, client: Any) -> list[Advice]:
    """A django-redis pool whose connections wait forever for a reply (redis-py before 8
    sets no socket timeout by default)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return []
    timeout = client_options.effective_connection_option(pool, "socket_timeout")
    if timeout is not None:
        return []
    alias = queue.config.redis_alias
    return [
        Advice(
            queue.name,
            logging.WARNING,
            f"the connection pool of cache {alias!r} sets no socket_timeout: a connection "
            "that a NAT or firewall drops silently stalls this worker for good. Set "
            f"CACHES[{alias!r}]['OPTIONS'] 'SOCKET_TIMEOUT' and 'SOCKET_CONNECT_TIMEOUT' "
            "(and CONNECTION_POOL_KWARGS for keepalive and health checks; see Connections in "
            "the docs' Redis settings page).",
        )
    ]
