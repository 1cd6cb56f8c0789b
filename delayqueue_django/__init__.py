"""delayqueue_django: a reliable, precise delay queue for Django on Redis.

import delayqueue_django as delayqueue

message_id = delayqueue.send({"order": 42}, delay=timedelta(minutes=30))
delayqueue.cancel(message_id)
"""

from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async

from delayqueue_django.core.cancel_hint import hint_if_elsewhere
from delayqueue_django.core.handlers import handler
from delayqueue_django.core.message import Message
from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue import Exhausted, Fetched, Queue
from delayqueue_django.core.registry import get_queue
from delayqueue_django.schedules.api import ScheduleInfo, Schedules

__all__ = [
    "Exhausted",
    "Fetched",
    "Message",
    "Outgoing",
    "Queue",
    "ScheduleInfo",
    "Schedules",
    "acancel",
    "asend",
    "cancel",
    "get_queue",
    "handler",
    "send",
]


def send(
    payload: Any,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    queue: str = "default",
    retry_count: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    outbox: bool | None = None,
) -> str:
    """Schedule ``payload`` for delivery after ``delay`` seconds (or at ``at``); returns its id.

    With neither, the message is due now. ``retry_count`` overrides the queue's RETRY_COUNT.
    ``on_commit`` (default: the queue's SEND_ON_COMMIT) sends it only when the current
    transaction on database ``using`` commits; the id is returned at once all the same.
    ``outbox`` (default: the queue's OUTBOX) writes it in that transaction, as a row of the
    database's outbox, which a relay moves to Redis once it committed.
    """
    return get_queue(queue).send(
        payload,
        delay=delay,
        at=at,
        retry_count=retry_count,
        on_commit=on_commit,
        using=using,
        outbox=outbox,
    )


def cancel(message_id: str, *, queue: str = "default") -> bool:
    """True if the message was waiting and will now never be delivered; else False.

    It looks on ``queue`` only: an id does not name its queue, so a message sent to
    another queue needs that queue's name here (with DEBUG on, a miss that another queue
    holds is logged as a warning naming it).
    """
    cancelled = get_queue(queue).cancel(message_id)
    if not cancelled:
        hint_if_elsewhere(message_id, queue=queue)
    return cancelled


async def asend(
    payload: Any,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    queue: str = "default",
    retry_count: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    outbox: bool | None = None,
) -> str:
    """``send`` for async views: non-blocking on redis.asyncio where the queue has a URL."""
    return await get_queue(queue).asend(
        payload,
        delay=delay,
        at=at,
        retry_count=retry_count,
        on_commit=on_commit,
        using=using,
        outbox=outbox,
    )


async def acancel(message_id: str, *, queue: str = "default") -> bool:
    """``cancel`` for async views."""
    cancelled = await get_queue(queue).acancel(message_id)
    if not cancelled:
        await sync_to_async(hint_if_elsewhere, thread_sensitive=False)(message_id, queue=queue)
    return cancelled
