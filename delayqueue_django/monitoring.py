"""A queue's state for monitoring (the admin's JSON view, ``delayqueue_stats``)."""

from typing import Any

from redis.exceptions import RedisError

from delayqueue_django.queue import Queue
from delayqueue_django.worker import heartbeat


def queue_report(queue: Queue) -> dict[str, Any]:
    """``{"ok": True, **stats, "workers": [live worker details]}``, or ``{"ok": False,
    "error": ...}`` when the queue's Redis cannot be reached."""
    try:
        stats = queue.stats()
        workers = heartbeat.live_workers(queue)
    except RedisError as error:
        return {"ok": False, "error": str(error)}
    return {"ok": True, **stats, "workers": workers}
