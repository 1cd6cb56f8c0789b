"""delayqueue_django: a reliable, precise delay queue for Django on Redis.

import delayqueue_django as delayqueue

message_id = delayqueue.send({"order": 42}, delay=timedelta(minutes=30))
delayqueue.cancel(message_id)

delayqueue.send({"order": 42}, key="expire-order-42", delay=timedelta(minutes=30))
delayqueue.cancel(key="expire-order-42")

delayqueue.send_many([{"order": 42}, delayqueue.Outgoing({"order": 43}, delay=60)])
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Never

from asgiref.sync import sync_to_async

from delayqueue_django.core.cancel_hint import hint_on_miss
from delayqueue_django.core.current import current_message
from delayqueue_django.core.handlers import handler
from delayqueue_django.core.message import Message
from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue import Exhausted, Fetched, Queue
from delayqueue_django.core.queue_schedules import ScheduleInfo
from delayqueue_django.core.registry import get_queue
from delayqueue_django.engine import Attempt
from delayqueue_django.exceptions import Postpone, Retry
from delayqueue_django.schedules.api import Schedules

__all__ = [
    "Attempt",
    "Exhausted",
    "Fetched",
    "Message",
    "Outgoing",
    "Postpone",
    "Queue",
    "Retry",
    "ScheduleInfo",
    "Schedules",
    "acancel",
    "areschedule",
    "asend",
    "asend_many",
    "cancel",
    "current_message",
    "get_queue",
    "handler",
    "reschedule",
    "send",
    "send_many",
]


def send(
    payload: Any,
    *,
    key: str | None = None,
    if_exists: str = "keep",
    unique_for: float | timedelta | None = None,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    expires: float | timedelta | datetime | None = None,
    queue: str = "default",
    retry_count: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    outbox: bool | None = None,
    group: str | None = None,
) -> str:
    """Schedule ``payload`` for delivery after ``delay`` seconds (or at ``at``); returns its id.

    With neither, the message is due now. ``retry_count`` overrides the queue's RETRY_COUNT.
    ``key`` (at most 256 bytes in UTF-8) names the message, at most one waiting per key and
    queue: ``if_exists`` ("keep", "replace" or "error") says what a send does when the key's
    message waits, and ``unique_for`` holds the key for that long after the send that
    creates its message; the id returned is then the one the key names (see
    ``Queue.send``). ``on_commit`` (default: the queue's SEND_ON_COMMIT) sends it only when
    the current transaction on database ``using`` commits; the id is returned at once all
    the same (with a key: the new message's, the key's outcome decided at the commit).
    ``outbox`` (default: the queue's OUTBOX) writes it in that transaction, as a row of the
    database's outbox, which a relay moves to Redis once it committed. ``group`` (at most
    256 bytes in UTF-8) orders it within that group: one at a time, in due-time order (see
    ``Queue.send``). ``expires`` (seconds or a timedelta from now, or a datetime; default:
    the queue's EXPIRES after the due time): a message not handed out by then never is
    (see ``Queue.send``).
    """
    return get_queue(queue).send(
        payload,
        key=key,
        if_exists=if_exists,
        unique_for=unique_for,
        delay=delay,
        at=at,
        expires=expires,
        retry_count=retry_count,
        on_commit=on_commit,
        using=using,
        outbox=outbox,
        group=group,
    )


def send_many(
    messages: Iterable[Any],
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    expires: float | timedelta | datetime | None = None,
    queue: str = "default",
    retry_count: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    outbox: bool | None = None,
    **per_message: Never,
) -> list[str]:
    """Schedule many messages on ``queue`` in one round trip; returns their ids in order.

    Items are payloads sharing the timing given here, or ``Outgoing`` objects with their
    own timing, ``key`` and ``group``: a key or a group is given per message, on its
    ``Outgoing`` (given to the call, it raises TypeError saying so). Every item is checked
    before anything is written. The options mean what they mean for ``send`` (see
    ``Queue.send_many``).
    """
    return get_queue(queue).send_many(
        messages,
        delay=delay,
        at=at,
        expires=expires,
        retry_count=retry_count,
        on_commit=on_commit,
        using=using,
        outbox=outbox,
        **per_message,
    )


def cancel(
    message_id: str | None = None, *, key: str | None = None, queue: str = "default"
) -> bool:
    """True if the message was waiting and will now never be delivered; else False.

    Give its id, or ``key=`` for the key's waiting message (not both). It looks on
    ``queue`` only: neither an id nor a key names its queue, so a message sent to another
    queue needs that queue's name here. With DEBUG on, an id's miss is looked into and
    logged as a warning when the id is a key of a message on ``queue`` (pass ``key=``),
    or another queue holds it.
    """
    cancelled = get_queue(queue).cancel(message_id, key=key)
    if not cancelled and message_id is not None:
        hint_on_miss(message_id, queue=queue)
    return cancelled


def reschedule(
    message_id: str | None = None,
    *,
    key: str | None = None,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    queue: str = "default",
) -> bool:
    """Give a waiting message (by id, or the key's) a new due time, ``delay`` from now (on
    Redis's clock) or ``at`` (neither: due now). True if it was changed; False if no
    message waits under that id or key on ``queue`` (in flight, dead, handled, unknown)."""
    return get_queue(queue).reschedule(message_id, key=key, delay=delay, at=at)


async def asend(
    payload: Any,
    *,
    key: str | None = None,
    if_exists: str = "keep",
    unique_for: float | timedelta | None = None,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    expires: float | timedelta | datetime | None = None,
    queue: str = "default",
    retry_count: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    outbox: bool | None = None,
    group: str | None = None,
) -> str:
    """``send`` for async views: non-blocking on redis.asyncio where the queue has a URL."""
    return await get_queue(queue).asend(
        payload,
        key=key,
        if_exists=if_exists,
        unique_for=unique_for,
        delay=delay,
        at=at,
        expires=expires,
        retry_count=retry_count,
        on_commit=on_commit,
        using=using,
        outbox=outbox,
        group=group,
    )


async def asend_many(
    messages: Iterable[Any],
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    expires: float | timedelta | datetime | None = None,
    queue: str = "default",
    retry_count: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    outbox: bool | None = None,
    **per_message: Never,
) -> list[str]:
    """``send_many`` for async views: non-blocking on redis.asyncio where the queue has a
    URL."""
    return await get_queue(queue).asend_many(
        messages,
        delay=delay,
        at=at,
        expires=expires,
        retry_count=retry_count,
        on_commit=on_commit,
        using=using,
        outbox=outbox,
        **per_message,
    )


async def acancel(
    message_id: str | None = None, *, key: str | None = None, queue: str = "default"
) -> bool:
    """``cancel`` for async views."""
    cancelled = await get_queue(queue).acancel(message_id, key=key)
    if not cancelled and message_id is not None:
        await sync_to_async(hint_on_miss, thread_sensitive=False)(message_id, queue=queue)
    return cancelled


async def areschedule(
    message_id: str | None = None,
    *,
    key: str | None = None,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    queue: str = "default",
) -> bool:
    """``reschedule`` for async views."""
    return await get_queue(queue).areschedule(message_id, key=key, delay=delay, at=at)
