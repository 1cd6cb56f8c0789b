"""Worker heartbeats, for the admin and for operators.

Each worker publishes, per queue, its details as JSON with a time to live of a few heartbeat
intervals (so a dead worker disappears on its own); the store keeps them (Redis: a key
``{prefix:queue}:worker:<id>`` and the index set ``{prefix:queue}:workers``).
"""

import json
import logging
from typing import Any

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import loggable, printable

logger = logging.getLogger("delayqueue_django")


def beat(queue: Queue, worker_id: str, details: dict[str, Any], ttl_seconds: float) -> None:
    """Publish this worker's details; one round trip."""
    queue.store.put_heartbeat(worker_id, json.dumps(details), int(ttl_seconds * 1000))


def forget(queue: Queue, worker_id: str) -> None:
    """Remove this worker's heartbeat (it is stopping)."""
    queue.store.drop_heartbeat(worker_id)


def live_workers(queue: Queue) -> list[dict[str, Any]]:
    """Details of the workers whose heartbeat has not expired, by id. A heartbeat that is not
    a JSON object is no worker's (anyone can write to Redis): skipped, with a warning."""
    workers = []
    for worker_id, text in sorted(queue.store.heartbeats().items()):
        try:
            details = json.loads(text)
        except (ValueError, RecursionError):
            details = None
        if not isinstance(details, dict):
            logger.warning(
                "heartbeat of worker id=%s queue=%s is not a JSON object, skipped: %.100r",
                loggable(worker_id),
                queue.name,
                text,
            )
            continue
        workers.append({**details, "id": printable(worker_id)})
    return workers
