"""Why ``cancel(id)`` found nothing, said where it helps.

An id does not name its queue (the Redis layout and the id format are shared with every
release that reads them), so ``cancel`` looks on the one queue it is given: ``"default"``
unless the call says ``queue=``. The caller knows the queue, as it knew it when it sent.
A call that forgets ``queue=`` answers False, which reads like a message already handled.
So with ``DEBUG`` on, a cancel that found nothing looks for the id on the other queues and
logs a warning naming the queue that holds it. A key passed as the id (``cancel("my-key")``
for ``cancel(key="my-key")``) answers False likewise: the same look first asks the queue
whether the string is the key of a message there, and says to pass ``key=``. With ``DEBUG``
off nothing more is asked of Redis: the usual False (a message handled before it could be
cancelled) costs what it did.
"""

import logging

from django.conf import settings

from delayqueue_django.core.registry import get_queue, queue_names
from delayqueue_django.engine.errors import QueueUnavailable

logger = logging.getLogger("delayqueue_django")


def queue_holding(message_id: str, *, besides: str) -> tuple[str, str] | None:
    """The first queue but ``besides`` that holds ``message_id``, with its state there."""
    for name in queue_names():
        if name == besides:
            continue
        try:
            found = get_queue(name).peek(message_id, preview_bytes=0)
        except (QueueUnavailable, ValueError):
            continue  # that queue's Redis is away, or the id is not one it could hold
        if found is not None:
            return name, found.state
    return None


def keyed_state(key: str, *, queue: str) -> str | None:
    """The state of the message ``key`` names on ``queue`` (see Queue.lookup), or None:
    none, or the string cannot be a key."""
    try:
        found = get_queue(queue).lookup(key)
    except (QueueUnavailable, ValueError):
        return None  # the queue's Redis is away, or the string is no key (InvalidKey)
    # (An outcome record, HISTORY_RETENTION: the key names no message to cancel.)
    return None if found is None or found.ended_at is not None else found.state


def hint_on_miss(message_id: str, *, queue: str) -> None:
    """Under DEBUG, log a warning when the id that a cancel on ``queue`` did not find is a
    key of a message on ``queue``, or when another queue holds the message."""
    if not settings.DEBUG:
        return
    state = keyed_state(message_id, queue=queue)
    if state is not None:
        logger.warning(
            "cancel(%r) looked for a message with that id on queue %r, and there is none; "
            "%r is the key of a message there (%s): pass key=%r. (Checked because DEBUG is "
            "on.)",
            message_id,
            queue,
            message_id,
            state,
            message_id,
        )
        return
    holder = queue_holding(message_id, besides=queue)
    if holder is not None:
        name, state = holder
        logger.warning(
            "cancel(%r) looked on queue %r only, which does not hold it; queue %r does (%s). "
            "An id does not name its queue: pass queue=%r. (Checked because DEBUG is on.)",
            message_id,
            queue,
            name,
            state,
            name,
        )
