"""A queue's state for monitoring (the admin, its JSON views, ``delayqueue_stats``)."""

from typing import Any

from django.db import DatabaseError
from redis.exceptions import RedisError

from delayqueue_django.queue import Queue
from delayqueue_django.worker import heartbeat


def queue_report(queue: Queue) -> dict[str, Any]:
    """``{"ok": True, **stats, "workers": [live worker details], **outbox}``, or ``{"ok":
    False, "error": ...}`` when the queue's Redis cannot be reached (see outbox_report)."""
    try:
        stats = queue.stats()
        workers = heartbeat.live_workers(queue)
    except RedisError as error:
        return {"ok": False, "error": str(error), **outbox_report(queue)}
    return {"ok": True, **stats, "workers": workers, **outbox_report(queue)}


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
