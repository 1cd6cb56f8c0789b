"""Worker heartbeats in Redis, for the admin and for operators.

Each worker writes, per queue, a key ``{prefix:queue}:worker:<id>`` holding its details as
JSON with a TTL of a few heartbeat intervals (so a dead worker disappears on its own), and
adds its id to the set ``{prefix:queue}:workers``, which readers prune of expired ids.
"""

import json
from typing import Any

from delayqueue_django.queue import Queue


def _keys(queue: Queue, worker_id: str) -> tuple[str, str]:
    keys = queue.store.keys
    return keys.key("workers"), keys.key(f"worker:{worker_id}")


def beat(queue: Queue, worker_id: str, details: dict[str, Any], ttl_seconds: float) -> None:
    """Publish this worker's details; one round trip."""
    index, key = _keys(queue, worker_id)
    client: Any = queue.store.client
    pipe = client.pipeline(transaction=False)
    pipe.set(key, json.dumps(details), px=max(int(ttl_seconds * 1000), 1))
    pipe.sadd(index, worker_id)
    pipe.execute()


def forget(queue: Queue, worker_id: str) -> None:
    """Remove this worker's heartbeat (it is stopping)."""
    index, key = _keys(queue, worker_id)
    client: Any = queue.store.client
    pipe = client.pipeline(transaction=False)
    pipe.delete(key)
    pipe.srem(index, worker_id)
    pipe.execute()


def live_workers(queue: Queue) -> list[dict[str, Any]]:
    """Details of the workers whose heartbeat has not expired, by id."""
    client: Any = queue.store.client
    index = queue.store.keys.key("workers")
    ids = sorted(
        member.decode() if isinstance(member, bytes) else member
        for member in client.smembers(index)
    )
    if not ids:
        return []
    values = client.mget([_keys(queue, worker_id)[1] for worker_id in ids])
    live, gone = [], []
    for worker_id, value in zip(ids, values, strict=True):
        if value is None:
            gone.append(worker_id)
        else:
            live.append({"id": worker_id, **json.loads(value)})
    if gone:
        client.srem(index, *gone)
    return live
