"""The exceptions delayqueue_django raises.

Every one derives from ``DelayQueueError``; each also derives from the built-in exception a
caller would naturally catch (``ValueError`` for a bad argument, ``TypeError`` for a payload
JSON cannot carry, ``LookupError`` for an unknown queue), configuration errors from
Django's ``ImproperlyConfigured``, and a Redis that cannot be reached (``QueueUnavailable``)
from redis-py's ``ConnectionError``.
"""

import math
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from delayqueue_django.engine.errors import (
    DelayQueueError,
    DuplicateKey,
    DuplicateMessageId,
    InvalidExpiry,
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
    "HandlerReturnedAwaitable",
    "InvalidDelay",
    "InvalidExpiry",
    "InvalidGroup",
    "InvalidKey",
    "InvalidKeyOption",
    "InvalidRetryCount",
    "InvalidSchedule",
    "PayloadEncodingError",
    "PayloadTooLarge",
    "Postpone",
    "QueueConfigurationError",
    "QueueTimedOut",
    "QueueUnavailable",
    "RedisOutOfMemory",
    "Reject",
    "Retry",
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
    holding a lone surrogate), or its ``if_exists`` or ``unique_for`` is not (raised as
    InvalidKeyOption, which is an InvalidKey)."""


class InvalidKeyOption(InvalidKey):
    """A keyed send's ``if_exists`` is not "keep", "replace" or "error", or its
    ``unique_for`` is not a positive number of seconds or timedelta. The key may be fine:
    the message names the option. An InvalidKey (and a ValueError) all the same, as code
    that caught InvalidKey for these before still does."""


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


class Postpone(DelayQueueError):
    """Raised by a handler: not now; deliver the message again after ``delay`` (seconds or a
    timedelta) without using a retry ("Retry-After", "the order is still being paid"). The
    queue's MAX_POSTPONES bounds how often one message may be postponed: the next postpone
    dead-letters it with the reason "postponed too often"."""

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        self.delay_ms = verdict_delay_ms(delay, "Postpone")
        # The handler's own words ("" for none): the worker's log line says the delay.
        self.reason = reason
        super().__init__(reason or f"postponed for {self.delay_ms} ms")


class Retry(DelayQueueError):
    """Raised by a handler: this attempt failed; retry after ``delay`` (seconds or a
    timedelta), or without one after the queue's NACK_REDELIVERY_DELAY. It uses a retry as
    any failure does: with none left, the message is buried. A failure the handler expects
    (a partner down, "Retry-After"): the worker logs one line with the ``reason``, where an
    unexpected exception gets its traceback."""

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        self.delay_ms = None if delay is None else verdict_delay_ms(delay, "Retry")
        # The handler's own words ("" for none): the worker's log line says the delay.
        self.reason = reason
        default = "retry" if self.delay_ms is None else f"retry in {self.delay_ms} ms"
        super().__init__(reason or default)


def verdict_delay_ms(delay: Any, verdict: str) -> int:
    """A Postpone's or Retry's delay in whole ms, rounded up; InvalidDelay if it is not a
    finite number of seconds (zero or more) or a timedelta of zero or more."""
    if isinstance(delay, timedelta):
        seconds: float = delay.total_seconds()
    elif isinstance(delay, bool) or not isinstance(delay, int | float):
        raise InvalidDelay(
            f"{verdict}'s delay must be a number of seconds or a timedelta, "
            f"not {type(delay).__name__}"
        )
    else:
        seconds = delay
    if not math.isfinite(seconds) or seconds < 0 or seconds > LONGEST_VERDICT_DELAY_SECONDS:
        raise InvalidDelay(
            f"{verdict}'s delay must be from 0 to {LONGEST_VERDICT_DELAY_SECONDS} seconds, "
            f"not {delay!r}"
        )
    return math.ceil(round(seconds * 1_000_000) / 1000)


# A year: a Postpone or Retry further off is a mistake, not a plan.
LONGEST_VERDICT_DELAY_SECONDS = 366 * 24 * 3600


class TaskExpired(DelayQueueError):
    """A task's message expired (its queue's EXPIRES) before it could run, or before its
    retry was due."""


class TaskAbandoned(DelayQueueError):
    """A task's last delivery ended with no outcome recorded: its worker died, or it ran past
    the queue's MAX_CONSUME_DURATION, and no retry was left."""


class HandlerReturnedAwaitable(DelayQueueError, TypeError):
    """A handler that is not ``async def`` returned an awaitable (a coroutine, a Task, a
    Future) instead of a verdict, or an ``async def`` one returned an awaitable it did not
    await, or a handler with a ``yield`` returned its generator: the code it meant to run
    never ran. The delivery is refused (a failed attempt),
    never acked. Declare the handler ``async def`` (the worker then awaits it on its event
    loop), or await what an async one returns."""


class TimeLimitExceeded(DelayQueueError):
    """A handler ran past its queue's TIME_LIMIT. Raised by ``message.check_time_limit()``
    (the soft check a handler calls between steps, where handler threads share a process);
    also the ``error`` of ``message_nacked`` when the supervisor killed a worker process
    whose handler ran past it (``run_delayqueue --processes``, ``--concurrency 1``)."""
