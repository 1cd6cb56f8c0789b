"""A queue's state for monitoring (the admin, its JSON views, ``delayqueue_stats``, the
Prometheus metrics): its totals and, for a sharded queue, each shard's."""

from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.sharding.placement import slot_of
from delayqueue_django.engine.sharding.stats import partial_stats, read_stats
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.exceptions import QueueUnavailable
from delayqueue_django.worker import heartbeat

# What a shard's report holds besides its stats (see shard_reports).
SHARD_FIELDS = ("ok", "tag", "slot", "server", "error")


def queue_report(queue: Queue) -> dict[str, Any]:
    """``{"ok": True, **stats, "workers": [live worker details], **outbox}``, or ``{"ok":
    False, "error": ...}`` when the queue's Redis cannot be reached (see outbox_report).
    A sharded queue's report also has ``shards``, each shard's (see shard_reports): its
    stats are their sum. A shard that cannot be reached makes the report ``ok: False``,
    its ``error`` naming the shards down (see unreachable), with the figures of the others
    still there: summed over them, and ``shards_down`` counting the rest (queue_totals);
    ``workers`` is None when shard 0, which holds the heartbeats, is one of them."""
    shards = shard_reports(queue)
    try:
        stats = queue_totals(queue, shards)
        workers = None if shard_down(shards, "0") else heartbeat.live_workers(queue)
    except RedisError as error:
        report: dict[str, Any] = {"ok": False, "error": str(error), **outbox_report(queue)}
    else:
        report = {"ok": True, **stats, "workers": workers, **outbox_report(queue)}
        if stats["shards_down"]:
            report.update(ok=False, error=unreachable(queue, shards or {}))
    if shards is not None:
        report["shards"] = shards
    return report


def shard_reports(queue: Queue) -> dict[str, dict[str, Any]] | None:
    """Each shard of a sharded queue, by name (every part it reads, see
    ``engine.sharding.store.parts``), one round trip each (see read_stats: a server that did
    not answer is not asked for its other shards): ``{"ok": True, "tag", "slot", "server",
    **its stats}``, or, when its Redis cannot be reached, ``{"ok": False, "tag", "slot",
    "server", "error"}``. ``slot`` and ``server`` (the master holding the shard) are those
    of Redis Cluster, else None. None for an unsharded queue: its one shard's figures are
    the queue's."""
    stores = parts(queue.store)
    if len(stores) == 1:
        return None
    read = read_stats(stores)
    return {name: _shard_report(store, read[name]) for name, store in stores.items()}


def queue_totals(queue: Queue, shards: Mapping[str, Mapping[str, Any]] | None) -> dict[str, int]:
    """The queue's figures in Redis (``queue.stats()`` but the outbox, which readers take
    from outbox_report: a database down must not hide them), summed from ``shards``
    (shard_reports) for a sharded queue as ``ShardedStore.stats()`` sums them, without
    reading them again: over the shards that answered, ``shards_down`` counting the others.
    Raises QueueUnavailable when none answered."""
    if shards is None:
        try:
            return queue.store.stats()
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise queue.unavailable(error) from error
    answered = [shard_stats(shard) for shard in shards.values() if shard["ok"]]
    if not answered:
        raise QueueUnavailable(unreachable(queue, shards))
    return partial_stats(answered, len(shards))


def unreachable(queue: Queue, shards: Mapping[str, Mapping[str, Any]]) -> str:
    """What to say of the shards that could not be reached: ``queue 'q' cannot reach Redis
    for shard(s) 6.2, 6.4 (on 127.0.0.1:7001): <the first one's error>``. Their server is
    the Redis Cluster master holding them where known; off Redis Cluster, the queue's."""
    down = {name: shard for name, shard in shards.items() if not shard["ok"]}
    servers = dict.fromkeys(
        shard["server"] if shard["slot"] is not None else queue.address for shard in down.values()
    )
    where = ", ".join(server for server in servers if server)
    return (
        f"queue {queue.name!r} cannot reach Redis for shard(s) {', '.join(down)}"
        f"{f' (on {where})' if where else ''}: {next(iter(down.values()))['error']}"
    )


def shard_stats(shard: Mapping[str, Any]) -> dict[str, int]:
    """A reachable shard's stats, without the fields that say where it is."""
    return {name: value for name, value in shard.items() if name not in SHARD_FIELDS}


def shard_down(shards: Mapping[str, Mapping[str, Any]] | None, name: str) -> bool:
    """Whether shard ``name`` of a sharded queue could not be read (see shard_reports)."""
    return shards is not None and not shards[name]["ok"]


def _shard_report(store: ShardStore, read: dict[str, int] | Exception) -> dict[str, Any]:
    where: dict[str, Any] = {"tag": store.keys.tag, "slot": None, "server": None}
    if isinstance(store, RedisStore) and isinstance(store.client, RedisCluster):
        where.update(slot=slot_of(store.keys), server=store.cluster_master() or None)
    if isinstance(read, Exception):
        return {"ok": False, **where, "error": str(read)}
    return {"ok": True, **where, **read}


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


def is_supervisor(worker: dict[str, Any]) -> bool:
    """A heartbeat of ``run_delayqueue --processes``'s supervisor, which handles nothing
    itself: its worker processes beat on their own."""
    return worker.get("role") == "supervisor"


def worker_processes(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The heartbeats of the processes that handle messages (supervisors left out)."""
    return [worker for worker in workers if not is_supervisor(worker)]


def describe_worker(worker: dict[str, Any]) -> str:
    """One live worker, for people: ``host:pid (12 handled, 0 failed)``, with the pid of
    its supervisor if it has one; a supervisor as ``host:pid supervising 4 processes, 1
    restart``."""
    where = f"{worker.get('host')}:{worker.get('pid')}"
    if is_supervisor(worker):
        restarts = worker.get("restarts")
        plural = "" if restarts == 1 else "s"
        return (
            f"{where} supervising {worker.get('processes')} processes, {restarts} restart{plural}"
        )
    text = f"{where} ({worker.get('handled')} handled, {worker.get('failed')} failed"
    if worker.get("supervisor"):
        text += f", under {worker.get('supervisor')}"
    return text + ")"
