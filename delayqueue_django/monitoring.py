"""A queue's state for monitoring (the admin, its JSON views, ``delayqueue_stats``, the
Prometheus metrics): its totals and, for a sharded queue, each shard's."""

from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.sharded_store import combined_stats, parts
from delayqueue_django.engine.shards import slot_of
from delayqueue_django.exceptions import QueueUnavailable
from delayqueue_django.queue import Queue
from delayqueue_django.redis_checks import server_of
from delayqueue_django.worker import heartbeat

# What a shard's report holds besides its stats (see shard_reports).
SHARD_FIELDS = ("ok", "tag", "slot", "server", "error")


def queue_report(queue: Queue) -> dict[str, Any]:
    """``{"ok": True, **stats, "workers": [live worker details], **outbox}``, or ``{"ok":
    False, "error": ...}`` when the queue's Redis cannot be reached (see outbox_report).
    A sharded queue's report also has ``shards``, each shard's (see shard_reports): its
    stats are their sum, and a shard that cannot be reached makes the report ``ok: False``
    (the sums would be short) with the other shards' figures still there."""
    shards = shard_reports(queue)
    try:
        stats = queue_totals(queue, shards)
        workers = heartbeat.live_workers(queue)
    except RedisError as error:
        report: dict[str, Any] = {"ok": False, "error": str(error), **outbox_report(queue)}
    else:
        report = {"ok": True, **stats, "workers": workers, **outbox_report(queue)}
    if shards is not None:
        report["shards"] = shards
    return report


def shard_reports(queue: Queue) -> dict[str, dict[str, Any]] | None:
    """Each shard of a sharded queue, by name (every part it reads, see
    ``engine.sharded_store.parts``), one round trip each: ``{"ok": True, "tag", "slot",
    "server", **its stats}``, or, when its Redis cannot be reached, ``{"ok": False, "tag",
    "slot", "server", "error"}``. ``slot`` and ``server`` (the master holding the shard)
    are those of Redis Cluster, else None. None for an unsharded queue: its one shard's
    figures are the queue's."""
    stores = parts(queue.store)
    if len(stores) == 1:
        return None
    return {name: _shard_report(store) for name, store in stores.items()}


def queue_totals(queue: Queue, shards: Mapping[str, Mapping[str, Any]] | None) -> dict[str, int]:
    """The queue's figures in Redis (``queue.stats()`` but the outbox, which readers take
    from outbox_report: a database down must not hide them), summed from ``shards``
    (shard_reports) for a sharded queue as ``ShardedStore.stats()`` sums them, without
    reading them again. Raises QueueUnavailable naming the shards that could not be
    reached: the totals would be short."""
    if shards is None:
        try:
            return queue.store.stats()
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise queue.unavailable(error) from error
    missing = {name: shard["error"] for name, shard in shards.items() if not shard["ok"]}
    if missing:
        names = ", ".join(missing)
        raise QueueUnavailable(
            f"queue {queue.name!r} cannot reach Redis for shard(s) {names}: "
            f"{next(iter(missing.values()))}"
        )
    return combined_stats([shard_stats(shard) for shard in shards.values()])


def shard_stats(shard: Mapping[str, Any]) -> dict[str, int]:
    """A reachable shard's stats, without the fields that say where it is."""
    return {name: value for name, value in shard.items() if name not in SHARD_FIELDS}


def _shard_report(store: ShardStore) -> dict[str, Any]:
    where: dict[str, Any] = {"tag": store.keys.tag, "slot": None, "server": None}
    if isinstance(store, RedisStore) and isinstance(store.client, RedisCluster):
        where.update(slot=slot_of(store.keys), server=server_of(store) or None)
    try:
        return {"ok": True, **where, **store.stats()}
    except RedisError as error:
        return {"ok": False, **where, "error": str(error)}


def outbox_report(queue: Queue) -> dict[str, Any]:
    """The queue's rows waiting in the outbox (``outbox``, ``outbox_age_ms``), or, when a
    database cannot answer, both None and ``outbox_error``."""
    try:
        return queue.outbox_stats()
    except DatabaseError as error:
        return {"outbox": None, "outbox_age_ms": None, "outbox_error": str(error)}


def running_handlers(worker: dict[str, Any]) -> list[dict[str, Any]]:
    """The handlers a live worker reported running at its last heartbeat (see
    ``Worker.running_handlers``); none from a worker that does not report them."""
    running = worker.get("running")
    if not isinstance(running, list):
        return []
    return [handler for handler in running if isinstance(handler, dict)]


def describe_running(handler: dict[str, Any]) -> str:
    """One running handler, for people: ``id (queue, attempt 2) for 12.5 s, past its
    deadline``."""
    text = (
        f"{handler.get('id')} ({handler.get('queue')}, attempt {handler.get('attempt')}) "
        f"for {handler.get('age')} s"
    )
    if handler.get("past_deadline"):
        text += ", past its deadline"
    return text
