"""The exceptions delayqueue_django raises.

Every one derives from ``DelayQueueError``; each also derives from the built-in exception a
caller would naturally catch (``ValueError`` for a bad argument, ``TypeError`` for a payload
JSON cannot carry, ``LookupError`` for an unknown queue), configuration errors from
Django's ``ImproperlyConfigured``, and a Redis that cannot be reached (``QueueUnavailable``)
from redis-py's ``ConnectionError``.
"""

from django.core.exceptions import ImproperlyConfigured

from delayqueue_django.engine.errors import (
    DelayQueueError,
    DuplicateKey,
    DuplicateMessageId,
    QueueTimedOut,
    QueueUnavailable,
    RedisOutOfMemory,
    UnsupportedRedisVersion,
)

__all__ = [
    "ConflictingOptions",
    "DelayQueueError",
    "DuplicateKey",
    "DuplicateMessageId",
    "InvalidDelay",
    "InvalidGroup",
    "InvalidKey",
    "InvalidRetryCount",
    "InvalidSchedule",
    "PayloadEncodingError",
    "PayloadTooLarge",
    "QueueConfigurationError",
    "QueueTimedOut",
    "QueueUnavailable",
    "RedisOutOfMemory",
    "Reject",
    "UnknownQueue",
    "UnknownSchedule",
    "UnsupportedRedisVersion",
]


class QueueConfigurationError(DelayQueueError, ImproperlyConfigured):
    """The DELAYQUEUES setting is invalid, or the app is missing from INSTALLED_APPS."""


class UnknownQueue(DelayQueueError, LookupError):
    """No queue of that name is configured in DELAYQUEUES."""

    def __str__(self) -> str:  # LookupError would quote the message.
        return str(self.args[0]) if self.args else ""


class PayloadEncodingError(DelayQueueError, TypeError):
    """The payload holds a value JSON cannot carry."""


class PayloadTooLarge(DelayQueueError, ValueError):
    """The encoded payload is larger than the queue's MAX_PAYLOAD_BYTES."""


class InvalidDelay(DelayQueueError, ValueError):
    """The delay or due time given to send is not usable."""


class InvalidKey(DelayQueueError, ValueError):
    """A send's key is not usable (not a str, empty, longer than 256 bytes in UTF-8, or
    holding a lone surrogate), or its ``if_exists`` or ``unique_for`` is not."""


class InvalidGroup(DelayQueueError, ValueError):
    """A send's ordered group is not usable (not a str, empty, longer than 256 bytes in
    UTF-8, or holding a lone surrogate)."""


class InvalidRetryCount(DelayQueueError, ValueError):
    """The retry_count given to send is not an int from 0 to 1000."""


class InvalidSchedule(DelayQueueError, ValueError):
    """A schedule's definition is not usable (a malformed cron, an unknown time zone...).
    ``check_id`` is the system check that reports the same problem in settings."""

    def __init__(self, message: str, check_id: str = "") -> None:
        super().__init__(message)
        self.check_id = check_id


class UnknownSchedule(DelayQueueError, LookupError):
    """The queue has no schedule of that name."""

    def __str__(self) -> str:  # LookupError would quote the message.
        return str(self.args[0]) if self.args else ""


class ConflictingOptions(DelayQueueError, ValueError):
    """Options that cannot go together, such as send(outbox=True, on_commit=True)."""


class Reject(DelayQueueError):
    """Raised by a handler: the message can never succeed; bury it now, skipping its retries."""


class TaskAbandoned(DelayQueueError):
    """A task's last delivery ended with no outcome recorded: its worker died, or it ran past
    the queue's MAX_CONSUME_DURATION, and no retry was left."""


class TimeLimitExceeded(DelayQueueError):
    """A handler ran past its queue's TIME_LIMIT. Raised by ``message.check_time_limit()``
    (the soft check a handler calls between steps, where handler threads share a process);
    also the ``error`` of ``message_nacked`` when the supervisor killed a worker process
    whose handler ran past it (``run_delayqueue --processes``, ``--concurrency 1``)."""
