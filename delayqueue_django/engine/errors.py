"""Errors raised by the Redis protocol layer."""

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError
from redis.exceptions import TimeoutError as RedisTimeoutError


class DelayQueueError(Exception):
    """Base class of every error raised by delayqueue_django."""


class DuplicateMessageId(DelayQueueError):
    """A message id given to send is already known to the queue; nothing was written."""


class DuplicateKey(DelayQueueError):
    """A send with ``if_exists="error"`` named a key that a waiting message (or a
    ``unique_for`` hold) already has; nothing in its batch was written."""

    def __init__(self, key: str, message_id: str, *, held: bool = False) -> None:
        self.key, self.message_id, self.held = key, message_id, held
        why = "is held by unique_for for message" if held else "names the waiting message"
        super().__init__(f"key {key!r} {why} {message_id!r}; nothing in its batch was written")


class InvalidExpiry(DelayQueueError, ValueError):
    """A send's ``expires`` is not usable: not a number of seconds, a timedelta or a
    datetime, or not after the message's due time (it could never be handed out); nothing
    in its batch was written."""


def expiry_refusal(text: str, queue: str) -> "InvalidExpiry | None":
    """The send scripts' refusal "EXPIRES_BEFORE_DUE <id>" as InvalidExpiry; None for any
    other error."""
    if not text.startswith("EXPIRES_BEFORE_DUE "):
        return None
    return InvalidExpiry(
        f"message {text.split(' ', 1)[1]!r} of queue {queue!r} would expire at or before its "
        "due time, so it could never be handed out; nothing in its batch was written"
    )


class UnsupportedRedisVersion(DelayQueueError):
    """The Redis server is older than the oldest version the scripts run on."""


class RedisOutOfMemory(DelayQueueError, OutOfMemoryError):
    """Redis refused to store messages: it is over its maxmemory and may not evict keys
    (noeviction); nothing was written. Still a redis ``OutOfMemoryError``."""


class QueueUnavailable(DelayQueueError, RedisConnectionError):
    """The queue's Redis could not be reached: no connection, or one lost. The message says
    where (host:port, never credentials); redis-py's own error is its ``__cause__``.

    Still a redis ``ConnectionError``: code that caught redis-py's errors around a send
    (``except redis.ConnectionError`` or ``except redis.RedisError``) catches it as before,
    and so do the worker's loops."""


class QueueTimedOut(QueueUnavailable, RedisTimeoutError):
    """Redis did not answer within the socket timeout. Unlike a refused connection, the
    call may have run: a send may have been written, a cancel done. Also a redis
    ``TimeoutError``, as the error it stands for."""


def timed_out(error: BaseException) -> bool:
    """Redis did not answer in time: redis-py's TimeoutError, a socket's, or the queue's
    QueueTimedOut around them (a TimeoutError too)."""
    return isinstance(error, RedisTimeoutError | TimeoutError)


def is_outage(error: BaseException) -> bool:
    """Redis could not be reached, or did not answer: not a refusal it answered with."""
    return isinstance(error, RedisConnectionError | RedisTimeoutError | OSError)
